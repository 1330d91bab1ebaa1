#!/usr/bin/env python3
"""memgrad's benchmark suite: runs every entry of bench/runner/entries.py that fits this
machine (the CUDA set on a GPU, the CPU subset otherwise), the PyTorch counterparts when
PyTorch is installed, and writes OUT/results.json, OUT/report.md, OUT/index.html and one log
per entry under OUT/logs/.

    bazel run -c opt //bench:suite -- [--quick] [--only models,amp,...] [--out DIR]
    bash .stage/run.sh suite [--quick] [--only ...] [--out DIR]      (the staged copy)
    python3 bench/runner/suite.py --render RESULTS_JSON [--out DIR]  (report.md and index.html
                                                                      again from a run's results.json)

A progress line per entry, with the time left estimated from the entries' expected times
scaled by how the run has gone so far.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import entries as suite_entries  # noqa: E402
import environment  # noqa: E402
import records  # noqa: E402
import report_html  # noqa: E402
import report_md  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGED_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def locate(program):
    """The file of a program in a Bazel runfiles tree or in the staged layout (.stage/bin,
    .stage/pytorch); None when this build does not have it (a CUDA-only target)."""
    if program.startswith("//"):
        pkg, name = program[2:].split(":")
        candidates = [os.path.join(ROOT, pkg, name),
                      os.path.join(STAGED_ROOT, "bin", pkg.replace("/", "_") + "_" + name)]
    else:
        candidates = [os.path.join(ROOT, "bench", program), os.path.join(STAGED_ROOT, program)]
    return next((c for c in candidates if os.path.isfile(c)), None)


def torch_importable():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def plan(args, ctx):
    """(entry, argv or Skip) for every selected entry, in table order."""
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - set(suite_entries.TECHNIQUES)
    if unknown:
        sys.exit(f"suite: --only {','.join(sorted(unknown))}: not a technique; choose from "
                 f"{','.join(suite_entries.TECHNIQUES)}")
    out = []
    for e in suite_entries.SUITE:
        if only and e.technique not in only:
            continue
        a = e.args(ctx)
        path = locate(e.program)
        if isinstance(a, suite_entries.Skip):
            out.append((e, a))
        elif e.needs_cuda and not ctx.cuda:
            out.append((e, suite_entries.Skip("needs a CUDA device; none visible")))
        elif path is None:
            out.append((e, suite_entries.Skip(f"{e.program} is not in this build (CUDA-only target)")))
        else:
            prefix = [sys.executable] if path.endswith(".py") else []
            out.append((e, prefix + [path] + a))
    return out


def run_command(argv, log, timeout):
    """(stdout, exit status) of argv, stderr into `log`; raises TimeoutExpired after killing
    the command's whole process group (bench_dist's ranks too)."""
    with open(log, "w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=f, text=True, start_new_session=True)
        try:
            stdout, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            stdout, _ = p.communicate()
            f.write(stdout)
            raise
        f.write(stdout)
        return stdout, p.returncode


def run_entry(entry, argv, ctx, logs):
    """Runs one entry; returns (status, reason, records)."""
    timeout = entry.timeout[1 if ctx.quick else 0]
    gb_file = os.path.join(ctx.tmp, entry.name + ".gbench.json")
    if entry.output == "gbench":
        argv = argv + [f"--benchmark_out={gb_file}", "--benchmark_out_format=json"]
    try:
        stdout, rc = run_command(argv, os.path.join(logs, entry.name + ".log"), timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"no result within {timeout} s (the entry's limit)", []
    if entry.output == "check":
        rec = records.make_record(entry, entry.name, {}, "passed", "bool", [1.0 if rc == 0 else 0.0], entry.side)
        return ("ok", None, [rec]) if rc == 0 else ("failed", f"exit status {rc}", [rec])
    if entry.output == "gbench":
        doc = json.load(open(gb_file)) if os.path.exists(gb_file) else {}
        recs = records.from_google_benchmark(entry, doc)
        errors = records.google_benchmark_errors(doc)
    else:
        recs, errors = records.from_json_lines(entry, stdout), []
    if rc != 0:
        return "failed", f"exit status {rc}" + (f" after {len(recs)} records" if recs else ""), recs
    if not recs:
        lines = [line for line in stdout.strip().splitlines() if line.strip()]
        why = "; ".join(errors) or (lines[-1] if lines else "no output")
        return "skipped", f"nothing measured: {why}", []
    return "ok", None, recs


def fmt_s(s):
    return f"{int(s) // 60}m{int(s) % 60:02d}s" if s >= 60 else f"{s:.0f}s"


def run_all(planned, ctx, logs):
    mode = 1 if ctx.quick else 0
    runnable = [e for e, a in planned if not isinstance(a, suite_entries.Skip)]
    expected_left = sum(e.expect[mode] for e in runnable)
    expected_done = actual_done = 0.0
    results, all_records = [], []
    for i, (e, a) in enumerate(planned, 1):
        head = f"[{i}/{len(planned)}] {e.name:24s}"
        if isinstance(a, suite_entries.Skip):
            print(f"{head} skipped: {a.reason}", flush=True)
            results.append(entry_result(e, "skipped", a.reason, 0.0, 0, None))
            continue
        t0 = time.monotonic()
        status, reason, recs = run_entry(e, a, ctx, logs)
        wall = time.monotonic() - t0
        expected_left -= e.expect[mode]
        expected_done += e.expect[mode]
        actual_done += wall
        pace = actual_done / expected_done if expected_done else 1.0
        note = f" ({reason})" if reason else ""
        print(f"{head} {status:7s} {wall:6.1f}s {len(recs):4d} records{note}; ~{fmt_s(expected_left * pace)} left",
              flush=True)
        results.append(entry_result(e, status, reason, wall, len(recs), f"logs/{e.name}.log"))
        all_records.extend(recs)
    return results, all_records


def entry_result(e, status, reason, wall, n, log):
    return {"name": e.name, "technique": e.technique, "side": e.side, "program": e.program, "status": status,
            "reason": reason, "wall_s": round(wall, 2), "n_records": n, "log": log}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs of every technique (< 4 min on an H200)")
    ap.add_argument("--only", help="comma-separated techniques: " + ",".join(suite_entries.TECHNIQUES))
    ap.add_argument("--out", default="suite_out", help="output folder (default: suite_out)")
    ap.add_argument("--cpu", action="store_true", help="run the CPU subset even where a GPU is visible")
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="run nothing: write report.md and index.html into --out from this results.json")
    a = ap.parse_args(argv)
    # `bazel run` starts us in the runfiles tree: a relative --out means the caller's folder.
    if not os.path.isabs(a.out):
        a.out = os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()), a.out)
    return a


def write_reports(doc, out):
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report_md.render(doc))
    with open(os.path.join(out, "index.html"), "w") as f:
        f.write(report_html.render(doc))


def render_only(path, out):
    with open(path) as f:
        doc = json.load(f)
    problems = records.validate(doc)
    os.makedirs(out, exist_ok=True)
    write_reports(doc, out)
    print(f"suite: rendered {len(doc['records'])} records of {path} into {out}/report.md, index.html")
    for p in problems:
        print("suite: schema problem:", p, file=sys.stderr)
    return 1 if problems else 0


def main(argv):
    args = parse_args(argv)
    if args.render:
        return render_only(args.render if os.path.isabs(args.render) else
                           os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()), args.render),
                           args.out)
    t0 = time.monotonic()
    env = environment.collect([ROOT, STAGED_ROOT])
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="mg_suite_")
    ngpu = 0 if args.cpu else len(env["gpus"])
    ctx = suite_entries.Context(quick=args.quick, cuda=ngpu > 0, gpus=ngpu, torch=torch_importable(), tmp=tmp)
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    print(f"suite: {'quick' if ctx.quick else 'full'} run on {env['gpus'][0]['name'] if ctx.cuda else 'the CPU'}"
          f"{f' (x{ngpu})' if ngpu > 1 else ''}; PyTorch {env['pytorch'] or 'not installed'}; out {args.out}",
          flush=True)
    results, recs = run_all(plan(args, ctx), ctx, os.path.join(args.out, "logs"))
    shutil.rmtree(tmp, ignore_errors=True)
    doc = {
        "schema_version": records.SCHEMA_VERSION,
        "schema_doc": records.SCHEMA_DOC,
        "suite": {"quick": ctx.quick, "only": args.only.split(",") if args.only else None,
                  "device": "cuda" if ctx.cuda else "cpu", "gpus": ngpu, "pytorch": ctx.torch,
                  "wall_s": round(time.monotonic() - t0, 1), "command": " ".join(["suite"] + argv)},
        "environment": env,
        "entries": results,
        "records": recs,
    }
    problems = records.validate(doc)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    write_reports(doc, args.out)
    counts = {s: sum(r["status"] == s for r in results) for s in records.STATUSES}
    print(f"suite: {len(recs)} records; " + ", ".join(f"{n} {s}" for s, n in counts.items()) +
          f"; {fmt_s(doc['suite']['wall_s'])}; wrote {args.out}/results.json, report.md, index.html", flush=True)
    for p in problems:
        print("suite: schema problem:", p, file=sys.stderr)
    return 1 if problems or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
