#!/usr/bin/env python3
"""Peak memory against step time, one point per JSON result line, as a self-contained SVG.

    python3 tools/plot_tradeoff.py LOG --section HEADING --config "B=8 T=1024 bf16 autocast AdamW" OUT.svg

HEADING is the text of one "## " heading of the log; bench/results/README.md names the heading
each chart there was drawn from.

Reads the JSON lines of bench_models and bench/pytorch/models_step.py from LOG (from the line
that contains --section to the next "## " heading that does not), keeps those whose config
starts with --config, and plots step_ms (x) against peak_allocated_gib (y): memgrad's modes in
one colour, PyTorch eager and torch.compile in others, each point labelled with what its config
adds to --config. The first line of a repeated config wins."""
import argparse
import json

COLORS = {"memgrad": "#1f77b4", "pytorch_eager": "#d62728", "pytorch_compile": "#ff7f0e"}


def read_points(path, section, prefix):
    points, seen, inside = [], set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("## "):
            # A section's heading may run over several "## " lines: only the next run's heading
            # (the logs start each with "## Session" or "## Call") ends it.
            if section in line:
                inside = True
            elif line.startswith(("## Session", "## Call")):
                inside = False
            continue
        if not inside or not line.startswith("{"):
            continue
        r = json.loads(line)
        cfg = r.get("config", "")
        if not cfg.startswith(prefix) or "step_ms" not in r:
            continue
        side = r.get("side", "memgrad") if r["framework"] != "memgrad" else "memgrad"
        key = (side, cfg)
        if key in seen:
            continue
        seen.add(key)
        label = cfg[len(prefix):].strip() or "no recomputation"
        points.append((side, label, r["step_ms"], r["peak_allocated_gib"]))
    return points


def svg(points, title):
    W, H, L, R, T, B = 760, 460, 70, 230, 40, 50
    xs, ys = [p[2] for p in points], [p[3] for p in points]
    x0, x1 = min(xs) * 0.95, max(xs) * 1.03
    y0, y1 = 0.0, max(ys) * 1.1
    sx = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)
    sy = lambda y: H - B - (y - y0) / (y1 - y0) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="22" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">step time (ms, median)</text>',
           f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
           f'text-anchor="middle">peak allocated (GiB)</text>']
    for i in range(6):
        xv, yv = x0 + (x1 - x0) * i / 5, y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{sx(xv):.1f}" y="{H - B + 15}" text-anchor="middle">{xv:.1f}</text>')
        out.append(f'<text x="{L - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.1f}</text>')
        out.append(f'<line x1="{L}" y1="{sy(yv):.1f}" x2="{W - R}" y2="{sy(yv):.1f}" stroke="#eee"/>')
    for side, label, x, y in points:
        c = COLORS.get(side, "gray")
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{c}"/>')
        out.append(f'<text x="{sx(x) + 6:.1f}" y="{sy(y) - 5:.1f}" fill="{c}">{label}</text>')
    for i, (side, c) in enumerate(COLORS.items()):
        out.append(f'<circle cx="{W - R + 20}" cy="{T + 10 + 18 * i}" r="4" fill="{c}"/>')
        out.append(f'<text x="{W - R + 30}" y="{T + 14 + 18 * i}">{side}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--section", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--title", default="GPT-2 124M: peak memory against step time")
    a = ap.parse_args()
    pts = read_points(a.log, a.section, a.config)
    if not pts:
        raise SystemExit(f"plot_tradeoff: no result lines for {a.config!r} in section {a.section!r}")
    open(a.out, "w", encoding="utf-8").write(svg(pts, a.title))
    print(f"plot_tradeoff: {len(pts)} points -> {a.out}")


if __name__ == "__main__":
    main()
