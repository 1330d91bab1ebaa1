#!/usr/bin/env bash
# examples:fashion_mnist --cuda-graph: --help lists it, and on a machine without a GPU the flag is
# a clear error, not a silent eager run. Every training flag combines with it (f16 GradScaler,
# dropout, clipping, Adam, --save/--resume: capturable state on the device); the captured
# training itself runs on the H200 (docs/cuda_graphs.md).
set -uo pipefail
BIN="${TEST_SRCDIR}/${TEST_WORKSPACE:-memgrad}/examples/fashion_mnist"
fail=0
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
