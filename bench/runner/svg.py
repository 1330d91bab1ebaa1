"""Inline SVG charts for the suite's report page: horizontal bars and x-y points (optionally
joined), with axes, ticks, labels and reference lines. Plain strings, no scripts; colours
come from CSS classes the page defines (s0, s1, s2: memgrad, PyTorch eager, PyTorch compile)."""
import html
import math

WIDTH = 640
LEFT = 230  # room for bar labels
ROW = 18


def esc(s):
    return html.escape(str(s), quote=True)


def nice_ticks(lo, hi, n=5):
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:  # the axis must reach the largest value
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def fmt(v):
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def svg(width, height, body, title):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">'
            f'<text x="4" y="14" class="title">{esc(title)}</text>{"".join(body)}</svg>')


def bars(title, items, unit, ref=None):
    """items: [(label, value, series index)]; ref: (value, label) drawn as a dashed line."""
    top, right = 24, 70
    height = top + ROW * len(items) + 30
    vmax = max([v for _, v, _ in items] + [ref[0] if ref else 0]) or 1
    ticks = nice_ticks(0, vmax)
    scale = (WIDTH - LEFT - right) / ticks[-1]
    body = []
    for t in ticks:
        x = LEFT + t * scale
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - 26}" class="grid"/>'
                    f'<text x="{x:.1f}" y="{height - 14}" class="tick" text-anchor="middle">{fmt(t)}</text>')
    for i, (label, v, s) in enumerate(items):
        y = top + i * ROW
        body.append(f'<text x="{LEFT - 4}" y="{y + 12}" class="label" text-anchor="end">{esc(label)}</text>'
                    f'<rect x="{LEFT}" y="{y + 2}" width="{max(v * scale, 0.5):.1f}" height="{ROW - 5}" class="s{s}">'
                    f'<title>{esc(label)}: {fmt(v)} {esc(unit)}</title></rect>'
                    f'<text x="{LEFT + v * scale + 3:.1f}" y="{y + 12}" class="value">{fmt(v)}</text>')
    if ref:
        x = LEFT + ref[0] * scale
        body.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 26}" class="ref"/>'
                    f'<text x="{x + 3:.1f}" y="{top + 2}" class="tick">{esc(ref[1])}</text>')
    body.append(f'<text x="{WIDTH - 4}" y="{height - 2}" class="tick" text-anchor="end">{esc(unit)}</text>')
    return svg(WIDTH, height, body, title)


def points(title, series, xlabel, ylabel, joined=False, refs=()):
    """series: [(name, series index, [(x, y, point label)])]; refs: [("x"|"y", value, label)]."""
    w, h, left, top, bottom, right = WIDTH, 320, 60, 28, 40, 90  # right: room for point labels
    # Points that coincide (every technique's baseline at 1, 1) share one label; a chart with
    # many labels grows taller so that each can find a line of its own.
    n_labels = len({(round(x, 3), round(y, 3)) for _, _, pts in series for x, y, _ in pts})
    h = max(h, top + bottom + int(n_labels * LINE_H))
    xs = [p[0] for _, _, pts in series for p in pts] + [v for a, v, _ in refs if a == "x"]
    ys = [p[1] for _, _, pts in series for p in pts] + [v for a, v, _ in refs if a == "y"]
    xt = nice_ticks(min(xs + [0]), max(xs) * 1.05)
    yt = nice_ticks(min(ys + [0]), max(ys) * 1.05)

    def px(x):
        return left + (x - xt[0]) / (xt[-1] - xt[0]) * (w - left - right)

    def py(y):
        return h - bottom - (y - yt[0]) / (yt[-1] - yt[0]) * (h - top - bottom)

    body = [f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{h - bottom}" class="grid"/>'
            f'<text x="{px(t):.1f}" y="{h - bottom + 14}" class="tick" text-anchor="middle">{fmt(t)}</text>'
            for t in xt]
    body += [f'<line x1="{left}" y1="{py(t):.1f}" x2="{w - right}" y2="{py(t):.1f}" class="grid"/>'
             f'<text x="{left - 4}" y="{py(t) + 4:.1f}" class="tick" text-anchor="end">{fmt(t)}</text>' for t in yt]
    for axis, v, label in refs:
        if axis == "x":
            body.append(f'<line x1="{px(v):.1f}" y1="{top}" x2="{px(v):.1f}" y2="{h - bottom}" class="ref"/>'
                        f'<text x="{px(v) + 3:.1f}" y="{top + 10}" class="tick">{esc(label)}</text>')
        else:
            body.append(f'<line x1="{left}" y1="{py(v):.1f}" x2="{w - right}" y2="{py(v):.1f}" class="ref"/>'
                        f'<text x="{w - right}" y="{py(v) - 3:.1f}" class="tick" text-anchor="end">{esc(label)}</text>')
    for k, (name, s, pts) in enumerate(series):
        if joined and len(pts) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in sorted(pts))
            body.append(f'<polyline points="{path}" class="line s{s}"/>')
        for x, y, label in pts:
            body.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" class="s{s}">'
                        f'<title>{esc(name)} {esc(label)}: {fmt(x)}, {fmt(y)}</title></circle>')
        body.append(f'<rect x="{left + 8 + 150 * k}" y="{h - 14}" width="10" height="10" class="s{s}"/>'
                    f'<text x="{left + 22 + 150 * k}" y="{h - 5}" class="tick">{esc(name)}</text>')
    anchors = merge_coincident([(px(x), py(y), label) for _, _, pts in series for x, y, label in pts])
    for (ax, ay, label), (lx, ly, anchor) in zip(anchors, place_labels(anchors, w, top + 10, h - bottom)):
        if abs(ly - (ay - 4)) > 2:  # moved off its point: a leader line says whose label it is
            body.append(f'<line x1="{ax:.1f}" y1="{ay:.1f}" x2="{lx:.1f}" y2="{ly - 3:.1f}" class="leader"/>')
        end = ' text-anchor="end"' if anchor == "end" else ""
        body.append(f'<text x="{lx:.1f}" y="{ly:.1f}" class="point"{end}>{esc(label)}</text>')
    body.append(f'<text x="{w - right}" y="{h - bottom + 28}" class="tick" text-anchor="end">{esc(xlabel)}</text>'
                f'<text x="{left + 4}" y="{top - 6}" class="tick">{esc(ylabel)}</text>')
    return svg(w, h, body, title)


CHAR_W, LINE_H = 5.6, 11  # the 10px label font: mean character width and line height


def label_box(lx, ly, text, anchor):
    """(x0, y0, x1, y1) a label drawn at baseline (lx, ly) covers, approximately."""
    width = CHAR_W * len(text)
    x0 = lx - width if anchor == "end" else lx
    return (x0, ly - LINE_H + 2, x0 + width, ly + 2)


def overlaps(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def merge_coincident(anchors, within=2.0):
    """One label for points drawn on the same spot: the first one's, with "+N" for the others
    (each point's own tooltip still names it)."""
    groups = []
    for x, y, text in anchors:
        for g in groups:
            if abs(g[0] - x) <= within and abs(g[1] - y) <= within:
                g[3] += 1
                break
        else:
            groups.append([x, y, text, 0])
    return [(x, y, f"{text} (+{n})" if n else text) for x, y, text, n in groups]


def place_labels(anchors, width, lo, hi):
    """[(x, y baseline, "start"|"end")] for each point label in anchors [(px, py, text)]: to the
    right of its point (left where it would leave the chart), from the top point down, each at
    the nearest line above or below its point where it overlaps no label already placed and no
    point. Greedy, so a crowded cluster fans out into a column with leader lines."""
    dots = [(x - 4, y - 4, x + 4, y + 4) for x, y, _ in anchors]
    placed = [None] * len(anchors)
    boxes = []
    for i in sorted(range(len(anchors)), key=lambda i: (anchors[i][1], anchors[i][0])):
        x, y, text = anchors[i]
        fits_right = x + 6 + CHAR_W * len(text) <= width - 2
        sides = [("start", x + 6), ("end", x - 6)] if fits_right else [("end", x - 6)]
        home = y - 4
        best = None
        for k in range(0, int((hi - lo) / LINE_H * 2) + 2):
            for ly in ((home,) if k == 0 else (home + k * LINE_H / 2, home - k * LINE_H / 2)):
                if not lo <= ly <= hi:
                    continue
                for anchor, lx in sides:
                    box = label_box(lx, ly, text, anchor)
                    if box[0] >= 0 and not any(overlaps(box, b) for b in boxes) and \
                            not any(overlaps(box, d) for j, d in enumerate(dots) if j != i):
                        best = (lx, ly, anchor)
                        break
                if best:
                    break
            if best:
                break
        placed[i] = best or (sides[0][1], home, sides[0][0])
        boxes.append(label_box(*placed[i][:2], text, placed[i][2]))
    return placed
