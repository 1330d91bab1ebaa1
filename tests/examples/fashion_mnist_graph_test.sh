#!/usr/bin/env bash
# examples:fashion_mnist --cuda-graph: what a captured step cannot hold is refused up front with a
# usage error (exit 2) naming the flag and the reason, before any data is read; on a machine
# without a GPU the flag is a clear error, not a silent eager run. (The captured training itself
# runs on the H200: docs/cuda_graphs.md.)
set -uo pipefail
BIN="${TEST_SRCDIR}/${TEST_WORKSPACE:-memgrad}/examples/fashion_mnist"
fail=0
expect_usage() {  # expect_usage "reason text" flags...
  local want=$1
  shift
  out=$("$BIN" --cuda-graph "$@" 2>&1)
  rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "--cuda-graph: .*$want" <<<"$out"; then
    echo "FAIL: --cuda-graph $* gave rc=$rc: $out"
    fail=1
  fi
}
expect_usage "GradScaler" --amp f16
expect_usage "random mask" --dropout 0.1
expect_usage "norm on the host" --clip-grad-norm 1
expect_usage "adam counts its steps" --optimizer adam
expect_usage "save/--resume" --save /tmp/never.safetensors
"$BIN" --help | grep -q -- "--cuda-graph" || { echo "FAIL: --help does not list --cuda-graph"; fail=1; }
if [ -d /usr/share/datasets/fashion-mnist ] || [ -n "${MG_FASHION_MNIST:-}" ]; then
  out=$("$BIN" --cuda-graph --device cpu --limit-train 64 --epochs 1 --no-progress 2>&1)
  rc=$?
  if [ $rc -eq 0 ] || ! grep -q "needs a CUDA device" <<<"$out"; then
    echo "FAIL: --cuda-graph on the CPU gave rc=$rc: $(tail -3 <<<"$out")"
    fail=1
  fi
fi
[ $fail -eq 0 ] && echo PASS
exit $fail
