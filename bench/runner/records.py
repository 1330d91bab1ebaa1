"""Measurements as records: what a bench binary or PyTorch script prints, turned into the
rows of results.json (schema: docs/benchmarks_schema.md), and the schema check the suite's
test runs.

Two machine-readable sources, no prose scraping:
- JSON lines: every stdout line that starts with "{" is one object. Its "benchmark" (or
  "model", "bench", "section") names the benchmark; a numeric field whose name carries a unit
  (UNITS below) is a metric; "<metric>_min" / "<metric>_max" are that metric's extremes and
  "n_runs" (or "steps") how many runs the median is over; "side" overrides the entry's side; a
  "rows" list expands into one object per row (top-level fields shared). Everything else is a
  parameter of the configuration.
- Google Benchmark's --benchmark_out JSON: one benchmark per run name; each counter (and the
  real time) is a metric, its median / min / max over the repetitions. A label may end in
  "; key=value" pairs, which become parameters (attention_bench's "impl=tc").
"""
import json
import statistics

SCHEMA_VERSION = 1
SCHEMA_DOC = "docs/benchmarks_schema.md"
SIDES = ("memgrad", "pytorch_eager", "pytorch_compile")
STATUSES = ("ok", "failed", "skipped", "timeout")

# Field-name pattern -> unit, first match wins (a metric's name says what it measures). A pattern
# matches a whole name ("ms"), the end of a name ("_ms", "_gib"), or "_"-delimited words inside it
# ("_us_" in transform_us_per_image, "_vs_" in ratio_vs_pageable); a leading pattern ending in "_"
# ("vs_") matches the start of a name. Words, not substrings: "used" in nvml_peak_used_gib is not
# "_us" (microseconds).
UNITS = (
    ("images_per_s", "images/s"),
    ("tokens_per_s", "tokens/s"),
    ("samples_per_s", "samples/s"),
    ("GB_per_s", "GB/s"),
    ("GB/s", "GB/s"),
    ("TFLOP/s", "TFLOP/s"),
    ("tflops", "TFLOP/s"),
    ("ms_per_batch", "ms"),
    ("ns_per_op", "ns"),
    ("_gib", "GiB"),
    ("_GiB", "GiB"),
    ("_mib", "MiB"),
    ("_kib", "KiB"),
    ("_bytes", "bytes"),
    ("_ms", "ms"),
    ("ms", "ms"),
    ("_us", "us"),
    ("_ns", "ns"),
    ("speedup", "x"),
    ("ratio", "x"),
    ("_vs_", "x"),
    ("vs_", "x"),
    ("_over_", "x"),
    ("of_copy", "x"),
    ("of_same_size_copy", "x"),
    ("device_calls", "count"),
    ("_in_place", "count"),
    ("launches", "count"),
    ("passed", "bool"),
    ("mfu", "fraction"),
)
# Numeric fields that describe the configuration although their names carry a unit.
CONFIG_FIELDS = {"decode_us", "tensor_mib", "batch_per_rank", "seq", "params", "world", "workers", "tensors",
                 "B", "H", "T", "D", "ddp_bucket_mib"}
NAME_FIELDS = ("benchmark", "model", "bench", "section")
DROPPED_FIELDS = {"framework", "side", "n_runs", "steps", "loss", "rows", "torch"}
# Parameters that describe how, not what: kept in "params", left out of "config" (the key
# that pairs memgrad's record with PyTorch's for the same workload).
INFO_FIELDS = {"kernel", "device", "implementation", "args", "step_reps"}
N_RUNS_FIELDS = ("n_runs", "steps")


def _matches(name, pattern):
    if name == pattern or name.endswith(pattern):
        return True
    if pattern.startswith("_"):  # a whole word inside the name: "_us" in "transform_us_per_image"
        return pattern.rstrip("_") + "_" in name
    return pattern.endswith("_") and name.startswith(pattern)  # "vs_" in "vs_simt"


def unit_of(name):
    """The unit a metric's name implies, or None when the field is not a metric."""
    if name in CONFIG_FIELDS:
        return None
    for pattern, unit in UNITS:
        if _matches(name, pattern):
            return unit
    return None


def display_unit(record):
    """The unit to show for a record: what its metric's name implies now, else the stored one
    (a results.json written before a unit rule was mended still reads right)."""
    return unit_of(record["metric"]) or record["unit"]


def _param(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v  # 50.0 and 50 name one config


def config_string(params):
    """The workload's configuration: a "config" parameter as it is, then the other
    parameters as key=value (INFO_FIELDS left out)."""
    head = [str(params["config"])] if "config" in params else []
    return ", ".join(head + [f"{k}={_param(v)}" for k, v in params.items() if k != "config" and k not in INFO_FIELDS])


def make_record(entry, benchmark, params, metric, unit, values, side, extremes=(None, None), n_runs=None):
    """One row of results.json; `values` are the runs (their median is the value)."""
    median = statistics.median(values)
    lo = extremes[0] if extremes[0] is not None else (min(values) if len(values) > 1 else None)
    hi = extremes[1] if extremes[1] is not None else (max(values) if len(values) > 1 else None)
    return {
        "entry": entry.name,
        "technique": entry.technique,
        "side": side,
        "benchmark": benchmark,
        "config": config_string(params),
        "params": params,
        "metric": metric,
        "unit": unit,
        "value": median,
        "median": median,
        "min": lo,
        "max": hi,
        "spread": (hi - lo) / 2 if lo is not None and hi is not None else None,
        "n_runs": n_runs if n_runs is not None else len(values),
    }


def _expand_rows(obj):
    rows = obj.get("rows")
    if not isinstance(rows, list):
        return [obj]
    shared = {k: v for k, v in obj.items() if k != "rows"}
    return [{**shared, **row} for row in rows]


def _records_of_object(entry, obj):
    side = obj.get("side", entry.side)
    name_key = next((k for k in NAME_FIELDS if k in obj), None)
    benchmark = str(obj[name_key]) if name_key else entry.name
    n_runs = next((int(obj[k]) for k in N_RUNS_FIELDS if isinstance(obj.get(k), (int, float))), None)
    metrics, params = {}, {}
    for k, v in obj.items():
        if k == name_key or k in DROPPED_FIELDS or k.endswith("_min") or k.endswith("_max"):
            continue
        unit = unit_of(k) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        if unit:
            metrics[k] = (float(v), unit)
        elif isinstance(v, (str, int, float, bool)):
            params[k] = v
    if "passed" in obj and isinstance(obj["passed"], bool):
        metrics["passed"] = (1.0 if obj["passed"] else 0.0, "bool")
        params.pop("passed", None)
    return [make_record(entry, benchmark, params, m, unit, [v], side, (obj.get(m + "_min"), obj.get(m + "_max")),
                        n_runs) for m, (v, unit) in metrics.items()]


def from_json_lines(entry, text):
    """Records from the JSON lines in a command's output (other lines are ignored)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        for row in _expand_rows(obj):
            out.extend(_records_of_object(entry, row))
    return out


def _label_params(label):
    config, _, extra = label.partition("; ")
    params = {"config": config} if config else {}
    for pair in filter(None, extra.split(", ")):
        k, _, v = pair.partition("=")
        params[k.strip()] = v.strip()
    return params


RUN_OPTIONS = ("iterations:", "repeats:", "min_time:", "manual_time", "real_time", "threads:")


def from_google_benchmark(entry, doc):
    """Records from a --benchmark_out JSON document; errored runs give none (see skipped())."""
    runs = {}
    for b in doc.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        runs.setdefault(b.get("run_name", b["name"]), []).append(b)
    labels = [reps[0].get("label", "") for reps in runs.values()]
    out = []
    skip = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads", "iterations",
            "real_time", "cpu_time", "time_unit", "label", "family_index", "per_family_instance_index",
            "aggregate_name", "aggregate_unit", "error_occurred", "error_message"}
    for run_name, reps in runs.items():
        first = reps[0]
        family = run_name.split("/")[0].removeprefix("BM_")
        params = _label_params(first.get("label", ""))
        args = [a for a in run_name.split("/")[1:] if not a.startswith(RUN_OPTIONS)]
        if args:  # the arguments tell apart runs that share a label
            params["args"] = "/".join(args)
            if labels.count(first.get("label", "")) > 1:
                params["config"] = f"{params.get('config', '')} {params.pop('args')}".strip()
        series = {k: ([r[k] for r in reps if k in r], unit_of(k) or "") for k in first
                  if k not in skip and isinstance(first[k], (int, float)) and not isinstance(first[k], bool)}
        if "ms" not in series:  # manual-time benchmarks report their own ms counter
            series["real_time"] = ([r["real_time"] for r in reps], first.get("time_unit", "ns"))
        for metric, (values, unit) in series.items():
            out.append(make_record(entry, family, params, metric, unit, values, entry.side))
    return out


def google_benchmark_errors(doc):
    """The distinct error messages of errored runs (e.g. "no CUDA device")."""
    return sorted({b.get("error_message", "error") for b in doc.get("benchmarks", []) if b.get("error_occurred")})


# ---- the schema check (the suite's test and gen_benchmarks_md.py use it) ----

_TOP = {"schema_version": int, "schema_doc": str, "suite": dict, "environment": dict, "entries": list,
        "records": list}
_ENV = {"host": str, "date": str, "commit": str, "python": str, "cpu": str, "cpu_count": int, "gpus": list,
        "driver": (str, type(None)), "cuda_runtime": (str, type(None)), "cudnn": (str, type(None)),
        "nccl": (str, type(None)), "pytorch": (str, type(None))}
_ENTRY = {"name": str, "technique": str, "side": str, "status": str, "reason": (str, type(None)),
          "wall_s": (int, float), "n_records": int, "log": (str, type(None))}
_NUM_OR_NONE = (int, float, type(None))
_RECORD = {"entry": str, "technique": str, "side": str, "benchmark": str, "config": str, "params": dict,
           "metric": str, "unit": str, "value": (int, float), "median": (int, float), "min": _NUM_OR_NONE,
           "max": _NUM_OR_NONE, "spread": _NUM_OR_NONE, "n_runs": int}


def _check_keys(what, obj, spec, problems):
    for key, types in spec.items():
        if key not in obj:
            problems.append(f"{what}: missing key {key!r}")
        elif not isinstance(obj[key], types) or (types is int and isinstance(obj[key], bool)):
            problems.append(f"{what}: {key!r} is {type(obj[key]).__name__}, expected {types}")


def validate(doc):
    """A list of problems with a results.json document (empty: it follows the schema)."""
    problems = []
    _check_keys("results", doc, _TOP, problems)
    if problems:
        return problems
    if doc["schema_version"] != SCHEMA_VERSION:
        problems.append(f"schema_version {doc['schema_version']}, expected {SCHEMA_VERSION}")
    _check_keys("environment", doc["environment"], _ENV, problems)
    for i, e in enumerate(doc["entries"]):
        _check_keys(f"entries[{i}]", e, _ENTRY, problems)
        if e.get("status") not in STATUSES:
            problems.append(f"entries[{i}]: status {e.get('status')!r} not in {STATUSES}")
        if e.get("status") != "ok" and not e.get("reason"):
            problems.append(f"entries[{i}] ({e.get('name')}): status {e.get('status')} without a reason")
    names = {e.get("name") for e in doc["entries"]}
    for i, r in enumerate(doc["records"]):
        _check_keys(f"records[{i}]", r, _RECORD, problems)
        if r.get("side") not in SIDES:
            problems.append(f"records[{i}]: side {r.get('side')!r} not in {SIDES}")
        if r.get("entry") not in names:
            problems.append(f"records[{i}]: entry {r.get('entry')!r} is not in entries")
    return problems
