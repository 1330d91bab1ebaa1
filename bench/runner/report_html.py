"""The suite's report page (index.html): one self-contained file (inline SVG and CSS, no
scripts, no network) with a chart per technique and report_md's tables. A chart draws only
what the run measured; without data it says "not measured in this run"."""
import html

import report_md
import svg

SIDE_INDEX = {"memgrad": 0, "pytorch_eager": 1, "pytorch_compile": 2}
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1400px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{border:1px solid #e4e4e4;padding:6px;background:#fff}
.missing{width:640px;padding:40px 0;text-align:center;color:#888;border:1px dashed #ccc}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
th{background:#f4f4f4}ul.notes{color:#555;font-size:12px}
svg .title{font-weight:600;font-size:13px}svg .tick,svg .point{font-size:10px;fill:#555}
svg .label,svg .value{font-size:11px}svg .grid{stroke:#eee}svg .ref{stroke:#c33;stroke-dasharray:4 3}
svg .s0{fill:#2f6db5;stroke:#2f6db5}svg .s1{fill:#e08a1e;stroke:#e08a1e}svg .s2{fill:#6a9f3a;stroke:#6a9f3a}
svg .line{fill:none;stroke-width:1.5}svg .leader{stroke:#999;stroke-width:0.7}
"""


def where(doc, **match):
    return [r for r in doc["records"] if all(r.get(k) == v for k, v in match.items())]


def missing(title):
    return f'<div class="missing"><b>{html.escape(title)}</b><br>{report_md.NOT_MEASURED}</div>'


def chart(title, draw, has_data):
    return f'<div class="chart">{draw() if has_data else missing(title)}</div>'


def short(r):
    return r["config"].replace(" SGD(momentum)", "")[:40]


def memory_vs_time(doc):
    """Each technique's memory ratio against its time ratio, from the same run's baseline."""
    title = "Memory saved against time cost (ratios to the baseline in the same run)"
    series = []
    for side, idx in SIDE_INDEX.items():
        pts = []
        for tech, mem_key, time_key, invert in (("amp", "memory_vs_f32", "speedup_vs_f32", True),
                                                ("recompute", "peak_vs_none", "time_vs_none", False)):
            times = {(r["benchmark"], r["config"]): r["value"] for r in where(doc, technique=tech, metric=time_key,
                                                                              side=side)}
            for r in where(doc, technique=tech, metric=mem_key, side=side):
                t = times.get((r["benchmark"], r["config"]))
                if t:
                    label = r["params"].get("precision", r["params"].get("mode", ""))
                    pts.append((1 / t if invert else t, r["value"], f"{r['benchmark']} {label}"[:32]))
        if pts:
            series.append((report_md.SIDE_NAMES[side], idx, pts))
    return chart(title, lambda: svg.points(title, series, "step time / baseline", "peak memory / baseline",
                                           refs=[("x", 1.0, "baseline time"), ("y", 1.0, "")]), bool(series))


def versus_pytorch(doc):
    """memgrad's value over PyTorch's for each workload both ran (headline metrics): one axis
    whatever the unit, 1 = level with PyTorch, below 1 = memgrad faster or smaller."""
    title = "memgrad / PyTorch, same workload (below 1: memgrad faster or smaller)"
    short_metric = {"step_ms": "time", "peak_allocated_gib": "memory", "fused_ms": "time", "ms": "time",
                    "fwd_bwd_ms": "time"}
    items = []
    for (bench, config, metric, unit), sides in report_md.by_key(doc["records"]).items():
        if metric not in report_md.HEADLINE_METRICS or "memgrad" not in sides:
            continue
        mine = sides["memgrad"]["value"]
        for side, r in sides.items():
            if side != "memgrad" and r["value"]:
                label = f"{bench} {config}"[:27] + f" {short_metric.get(metric, metric)}"
                items.append((label, mine / r["value"], SIDE_INDEX[side]))
    return chart(title, lambda: svg.bars(title, items, "ratio (orange: vs PyTorch eager, green: vs torch.compile)", ref=(1.0, "= PyTorch")),
                 bool(items))


def recompute_curve(doc, benchmark):
    title = f"Recomputation trade-off, {benchmark}: peak memory against step time"
    series = []
    for side, idx in SIDE_INDEX.items():
        times = {r["params"].get("mode"): r["value"] for r in where(doc, technique="recompute", benchmark=benchmark,
                                                                    metric="step_ms", side=side)}
        pts = [(times[r["params"]["mode"]], r["value"], r["params"]["mode"])
               for r in where(doc, technique="recompute", benchmark=benchmark, metric="peak_allocated_gib",
                              side=side) if r["params"].get("mode") in times]
        if pts:
            series.append((report_md.SIDE_NAMES[side], idx, pts))
    return chart(title, lambda: svg.points(title, series, "step ms", "peak allocated GiB"), bool(series))


def fragmentation(doc):
    title = "Allocator: peak reserved / peak allocated on replayed traces (1.0 = no waste)"
    items = [(f"{r['benchmark'].removeprefix('Trace')} {r['config']}"[:36], r["value"], 0)
             for r in where(doc, technique="allocator", metric="reserved_over_alloc")]
    return chart(title, lambda: svg.bars(title, items, "x", ref=(1.0, "1.0")), bool(items))


def bandwidth(doc):
    title = "Kernel bandwidth against the device-to-device copy"
    copy = where(doc, technique="kernels", benchmark="DeviceCopy", metric="GB/s")
    items = [(r["config"][:36], r["value"], 0) for r in where(doc, technique="kernels", metric="GB/s")
             if r["benchmark"] != "DeviceCopy"]
    ref = (copy[0]["value"], "copy") if copy else None
    return chart(title, lambda: svg.bars(title, items, "GB/s", ref=ref), bool(items))


def gemm(doc):
    title = "GEMM 8192^3: memgrad kernels::gemm vs cuBLAS called directly (same workspace)"
    items = [(f"{r['benchmark']} {r['config'][-18:]}", r["value"], 0 if r["benchmark"] == "Matmul" else 1)
             for r in where(doc, technique="kernels", metric="TFLOP/s")]
    return chart(title, lambda: svg.bars(title, items, "TFLOP/s"), bool(items))


def ddp_scaling(doc):
    title = "Data-parallel scaling: tokens/s by world size (dashed: N x 1 rank)"
    recs = where(doc, technique="distributed", metric="tokens_per_s")
    items = [(f"world {r['params'].get('world')}{' + ZeRO-1' if r['params'].get('zero') else ''}", r["value"], 0)
             for r in recs]
    one = [r["value"] for r in recs if r["params"].get("world") == 1]
    worlds = [r["params"].get("world", 1) for r in recs]
    ref = (one[0] * max(worlds), f"ideal x{max(worlds)}") if one else None
    return chart(title, lambda: svg.bars(title, items, "tokens/s", ref=ref), bool(items))


def loader_scaling(doc):
    title = "DataLoader: images/s against worker count"
    series = []
    for side, idx in SIDE_INDEX.items():
        pts = [(float(r["params"]["workers"]), r["value"], "") for r in
               where(doc, technique="data", benchmark="loader_workers", metric="images_per_s", side=side)]
        if pts:
            series.append((report_md.SIDE_NAMES[side], idx, pts))
    return chart(title, lambda: svg.points(title, series, "workers", "images/s", joined=True), bool(series))


def charts(doc):
    return [memory_vs_time(doc), versus_pytorch(doc), recompute_curve(doc, "gpt2"), recompute_curve(doc, "mlp"),
            fragmentation(doc), bandwidth(doc), gemm(doc), ddp_scaling(doc), loader_scaling(doc)]


def html_table(header, rows):
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(doc):
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>memgrad benchmark suite</title>",
             f"<style>{CSS}</style></head><body><h1>memgrad benchmark suite</h1>",
             f"<p>{'--quick' if doc['suite']['quick'] else 'Full'} run on {html.escape(doc['suite']['device'])}, "
             f"{html.escape(doc['environment']['date'])}, commit {html.escape(doc['environment']['commit'])}. "
             "Values are medians; results.json holds every record (schema: "
             f"{html.escape(doc['schema_doc'])}).</p>",
             "<h2>Charts</h2><div class='charts'>", *charts(doc), "</div>"]
    for name, header, rows, notes in report_md.tables(doc):
        parts.append(f"<h2>{html.escape(name)}</h2>")
        if notes:
            parts.append("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
        if rows:
            parts.append(html_table(header, rows))
    parts.append("</body></html>\n")
    return "\n".join(parts)
