#!/usr/bin/env bash
# Runs on the device machine: every staged test binary (gtest XML + logs into $OUT), then
# the benchmarks. Prints the plain line "N passed, M failed, K skipped" for the tests.
set -uo pipefail
cd "$(dirname "$0")"
[ -d bin ] || tar -xJf bin.tar.xz
FINAL=${OUT:-/tmp/mg_out}
# Only 8 files come back from $OUT: work in a scratch folder, then tar it into $OUT.
OUT=$(mktemp -d)
mkdir -p "$OUT/xml" "$FINAL"
trap 'tar -czf "$FINAL/results.tgz" -C "$OUT" . 2>/dev/null' EXIT
# cuBLAS/cuDNN: the toolkit's, or the ones PyTorch's wheels ship.
LIBS=$PWD/lib:/usr/local/cuda/lib64
for d in $(python3 -c 'import nvidia, os; b=os.path.dirname(nvidia.__path__[0]); print(" ".join(os.path.join(r) for r, ds, fs in os.walk(b+"/nvidia") if r.endswith("/lib")))' 2>/dev/null); do
  LIBS=$LIBS:$d
done
export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The op table test reads autograd/functions.h: the staged tree sits inside the repository.
export MG_SOURCE_ROOT=${MG_SOURCE_ROOT:-$(cd .. && pwd)}
[ -d "$PWD/fashion-mnist" ] && export MG_FASHION_MNIST=$PWD/fashion-mnist
what=${1:-all}
# `run.sh exec BINARY ARGS...` runs one staged binary with this environment.
if [ "$what" = exec ]; then shift; exec "bin/$@"; fi
# `run.sh suite [--quick] [--only ...]`: the benchmark suite, the same driver and table as
# `bazel run //bench:suite` (bench/runner/). results.json, report.md and index.html land in
# $OUT; the per-entry logs in $OUT/results.tgz.
if [ "$what" = suite ]; then
  shift
  python3 runner/suite.py --out "$OUT/suite" "$@"
  rc=$?
  cp "$OUT"/suite/results.json "$OUT"/suite/report.md "$OUT"/suite/index.html "$FINAL"/ 2>/dev/null
  exit $rc
fi
# `run.sh ab N ARGS...`: bench_models of this tree and of the staged base (tools/stage_gpu.sh,
# MG_STAGE_BASE) in turns, N runs each with the same ARGS, each run's last MG_AB_TAIL lines
# (default 4: the JSON result line and what precedes it) under a label naming the build.
if [ "$what" = ab ]; then
  shift
  n=${1:?usage: run.sh ab N ARGS...}
  shift
  [ -x bin/base_bench_bench_models ] || { echo "run.sh ab: no base staged (MG_STAGE_BASE)"; exit 2; }
  echo "this tree $(cat COMMIT 2>/dev/null), base $(cat BASE_COMMIT 2>/dev/null): bench_models $*"
  for i in $(seq "$n"); do
    for who in this:bench_bench_models base:base_bench_bench_models; do
      echo "=== ${who%%:*} run $i"
      timeout 600 "bin/${who#*:}" "$@" 2>&1 | tail -n "${MG_AB_TAIL:-4}"
    done
  done
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ "$what" = tests ] || [ "$what" = all ]; then
  for b in bin/tests_*; do
    n=$(basename "$b")
    echo "=== $n"
    timeout 300 "$b" --gtest_output="xml:$OUT/xml/$n.xml" > "$OUT/$n.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests? ran|Failure|error" "$OUT/$n.log" | tail -15
    [ $rc -ne 0 ] && echo "!!! $n exited with $rc" && tail -30 "$OUT/$n.log"
  done
  python3 - "$OUT/xml" <<'PY'
import os, sys, xml.etree.ElementTree as ET
p = f = s = 0
for fn in os.listdir(sys.argv[1]):
    for tc in ET.parse(os.path.join(sys.argv[1], fn)).getroot().iter("testcase"):
        if tc.find("failure") is not None: f += 1
        elif tc.find("skipped") is not None or tc.get("result") == "skipped": s += 1
        else: p += 1
print(f"{p} passed, {f} failed, {s} skipped")
PY
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for b in bin/bench_*; do
    [ -x "$b" ] || continue
    echo "=== $(basename "$b")"
    timeout 300 "$b" --benchmark_out="$OUT/$(basename "$b").json" --benchmark_out_format=json 2>&1 | tail -40
  done
fi
