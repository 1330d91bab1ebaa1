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
# `run.sh suite`: the benchmark suite with its arguments, each memgrad measurement next to
# the PyTorch script for the same configs (one log per entry under $OUT, a summary on stdout).
if [ "$what" = suite ]; then
  [ -d bin ] || tar -xJf bin.tar.xz
  entry() {  # entry NAME TIMEOUT COMMAND...
    local name=$1 t=$2; shift 2
    echo "=== $name"
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    grep -E '^\{|speedup|ratio|vs_|PASS|FAIL|ok |error' "$OUT/$name.log" | tail -40
    [ $rc -ne 0 ] && echo "!!! $name exited with $rc" && tail -5 "$OUT/$name.log"
  }
  for e in ${SUITE:-models amp recompute optim attention data interop}; do
    case $e in
      models) entry models 120 bin/bench_bench_models --dtype bf16 --steps 10 --warmup 3
              entry models_f16 120 bin/bench_bench_models --dtype f16 --steps 10 --warmup 3 ;;
      amp) entry amp 240 bin/bench_bench_amp
           entry amp_pytorch 240 python3 pytorch/amp_step.py ;;
      recompute) entry recompute_bf16 200 bin/bench_bench_recompute --dtype bf16 --steps 10 --warmup 3
                 entry recompute_pytorch 200 python3 pytorch/recompute_step.py --dtype bf16 --steps 10 ;;
      recompute_f32) entry recompute_f32 200 bin/bench_bench_recompute --dtype f32 --steps 10 --warmup 3
                     entry recompute_inplace 60 bin/bench_bench_recompute --section inplace ;;
      optim) entry optim 120 bin/bench_bench_optim --steps 50
             entry optim_pytorch 120 python3 pytorch/optim_step.py --steps 50 ;;
      attention) entry attention 120 bin/bench_bench_attention --benchmark_filter='BM_PackedQkvAttention|BM_Attention/0/'
                 entry attention_pytorch 60 python3 pytorch/attention_sdpa.py ;;
      data) entry data 120 bin/bench_bench_data --workers 1,2,4,8,12
            entry data_pytorch 120 python3 pytorch/data_loader.py --workers 1,2,4,8,12 ;;
      interop) entry interop_write 30 bin/examples_safetensors_interop write /tmp/mg.safetensors
               entry interop_read 60 python3 pytorch/read_safetensors.py /tmp/mg.safetensors --write-back /tmp/pt.safetensors
               entry interop_check 30 bin/examples_safetensors_interop check /tmp/pt.safetensors ;;
    esac
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
