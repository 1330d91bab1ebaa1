"""The suite's report as tables: the environment, what ran, a headline table of memgrad next to
PyTorch, and one table per technique. `tables(doc)` builds them once; render() writes them as
Markdown (report.md, docs/benchmarks.md) and report_html.py as HTML."""
import entries as suite_entries
import records

SIDE_NAMES = {"memgrad": "memgrad", "pytorch_eager": "PyTorch eager", "pytorch_compile": "PyTorch compile"}
NOT_MEASURED = "not measured in this run"
# Headline: metrics where memgrad and PyTorch ran the same workload, smaller is better.
HEADLINE_METRICS = ("step_ms", "peak_allocated_gib", "fused_ms", "ms", "fwd_bwd_ms")


def fmt_value(r):
    v = r["value"]
    s = f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if r["min"] is not None and r["max"] is not None and r["n_runs"] > 1 and r["max"] > r["min"]:
        s += f" ({r['min']:.4g}-{r['max']:.4g})"
    return s


def environment_rows(doc):
    env, suite = doc["environment"], doc["suite"]
    gpus = ", ".join(f"{g['name']} ({g['memory_mib']} MiB)" for g in env["gpus"]) or "none"
    torch = env["pytorch"] or "not installed: no PyTorch rows in this run"
    if env["pytorch"]:
        torch += f" (CUDA {env.get('pytorch_cuda')}, cuDNN {env.get('pytorch_cudnn')}, NCCL {env.get('pytorch_nccl')})"
    return [
        ("run", f"{'--quick' if suite['quick'] else 'full'} on {suite['device']}, {suite['wall_s']} s, "
                f"`{suite['command']}`"),
        ("date", env["date"]), ("commit", env["commit"]), ("host", f"{env['host']}: {env['cpu']}, "
                                                                   f"{env['cpu_count']} cores"),
        ("GPUs", gpus), ("driver", env["driver"] or "-"), ("CUDA runtime", env["cuda_runtime"] or "-"),
        ("cuDNN", env["cudnn"] or "-"), ("NCCL", env["nccl"] or "-"), ("PyTorch", torch),
        ("Python", env["python"]),
    ]


def entry_rows(doc):
    return [(e["name"], e["technique"], SIDE_NAMES.get(e["side"], e["side"]), e["status"], f"{e['wall_s']:.1f}",
             str(e["n_records"]), e["reason"] or "") for e in doc["entries"]]


def by_key(recs):
    """{(benchmark, config, metric, unit): {side: record}} in first-seen order; the unit is the
    one the metric's name implies (records.display_unit)."""
    out = {}
    for r in recs:
        out.setdefault((r["benchmark"], r["config"], r["metric"], records.display_unit(r)), {})[r["side"]] = r
    return out


def technique_rows(recs):
    rows = []
    for (bench, config, metric, unit), sides in by_key(recs).items():
        cells = [fmt_value(sides[s]) if s in sides else "" for s in SIDE_NAMES]
        rows.append((bench, config, metric, unit, *cells))
    return rows


def headline_rows(doc):
    rows = []
    for (bench, config, metric, unit), sides in by_key(doc["records"]).items():
        if metric not in HEADLINE_METRICS or "memgrad" not in sides:
            continue
        for other in ("pytorch_eager", "pytorch_compile"):
            if other in sides and sides[other]["value"] > 0:
                m, p = sides["memgrad"]["value"], sides[other]["value"]
                rows.append((bench, config, f"{metric} ({unit})", f"{m:.4g}", SIDE_NAMES[other], f"{p:.4g}",
                             f"{m / p:.2f}"))
    return rows


def skipped_notes(doc, technique):
    return [f"{e['name']}: {e['status']} ({e['reason']})" for e in doc["entries"]
            if e["technique"] == technique and e["status"] != "ok"]


def implementation_notes(recs):
    """What each side ran, where a record says (PyTorch's SDPA kernel, its checkpointing)."""
    seen = {}
    for r in recs:
        for k in ("implementation", "kernel"):
            if k in r["params"]:
                seen.setdefault(f"{SIDE_NAMES[r['side']]}: {r['params'][k]}", None)
    return list(seen)


def tables(doc):
    """[(title, header, rows, notes)]: every table of the report, in order."""
    out = [("Environment", ("", ""), environment_rows(doc), []),
           ("Entries", ("entry", "technique", "side", "status", "wall s", "records", "reason"), entry_rows(doc),
            [])]
    head = headline_rows(doc)
    out.append(("Headline: memgrad next to PyTorch (same workload, same card, same run)",
                ("benchmark", "config", "metric", "memgrad", "vs", "PyTorch", "memgrad / PyTorch"), head,
                [] if head else [NOT_MEASURED + (": PyTorch is not installed" if not doc["suite"]["pytorch"]
                                                 else "")]))
    for tech, title in suite_entries.TECHNIQUES.items():
        recs = [r for r in doc["records"] if r["technique"] == tech]
        notes = implementation_notes(recs) + skipped_notes(doc, tech)
        if not recs:
            notes.insert(0, NOT_MEASURED)
        out.append((title, ("benchmark", "config", "metric", "unit", *SIDE_NAMES.values()), technique_rows(recs),
                    notes))
    return out


def md_cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(header, rows):
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render(doc, title="memgrad benchmark suite"):
    parts = [f"# {title}\n",
             "Generated by the benchmark suite (`bazel run -c opt //bench:suite`); schema: "
             f"[{doc['schema_doc']}]({doc['schema_doc']}). Values are medians over n runs, (min-max) where "
             "there was more than one.\n"]
    for name, header, rows, notes in tables(doc):
        parts.append(f"## {name}\n")
        parts.extend(f"- {n}" for n in notes)
        if notes:
            parts.append("")
        if rows:
            parts.append(md_table(header, rows) + "\n")
    return "\n".join(parts) + "\n"
