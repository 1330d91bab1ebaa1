#!/usr/bin/env bash
# Builds the test and bench binaries here (the device machine has no Bazel, gtest or
# Eigen) and stages them, with the few shared libraries the device lacks, into .stage/.
# Then, on the device machine (device tool, carry [".stage"]):
#   bash .stage/run.sh [tests|bench|all]      # results under $OUT
#   bash .stage/run.sh suite [--quick]        # the benchmark suite (bench/runner): report in $OUT
#   bash .stage/run.sh ab N ARGS...           # bench_models of this tree and of MG_STAGE_BASE in turns
set -euo pipefail
cd "$(dirname "$0")/.."

# Every test target, plus bench and example binaries. The default configuration already
# builds CUDA for sm_90 (= --config=cuda), and matching it keeps the analysis cache warm.
# MG_STAGE_TARGETS="//tests/nn:models_test //bench:bench_models ..." stages just those (a
# quicker build when one change needs a few binaries on the device).
if [ -n "${MG_STAGE_TARGETS:-}" ]; then
  TESTS=$(printf '%s\n' $MG_STAGE_TARGETS | grep '^//tests/' || true)
  BINS=$(printf '%s\n' $MG_STAGE_TARGETS | grep -v '^//tests/' || true)
else
  TESTS=$(bazel query 'kind(cc_test, //tests/...)' 2>/dev/null)
  BINS=$(bazel query 'kind(cc_binary, //bench/... + //examples/...)' 2>/dev/null || true)
fi
STAGE=$(printf '%s\n' $TESTS $BINS)
if ! bazel build --keep_going --jobs="${MG_JOBS:-2}" $TESTS $BINS; then
  # bazel-bin still holds the last good binary of a target that failed now: stage only the
  # targets that build, and name the others.
  STAGE=""
  for t in $TESTS $BINS; do
    if bazel build --jobs="${MG_JOBS:-2}" "$t" >/dev/null 2>&1; then STAGE="$STAGE $t"; else echo "stage: $t failed to build; not staged"; fi
  done
fi

rm -rf .stage
mkdir -p .stage/bin .stage/lib
for t in $STAGE; do
  p=${t#//}
  p=bazel-bin/${p/://}
  [ -x "$p" ] && cp "$p" ".stage/bin/$(echo "${t#//}" | tr '/:' '__')"
done
# MG_STAGE_BASE=<rev>: bench_models built from <rev> too, staged as base_bench_bench_models, so
# that `run.sh ab` can time the change against its base in turns within one device call (the
# card's speed moves between calls by more than a change of a few percent). The base builds in
# a git worktree with its own Bazel output base (the shared disk cache makes it mostly hits);
# both are removed afterwards.
if [ -n "${MG_STAGE_BASE:-}" ]; then
  wt=$(mktemp -d /tmp/mg_base.XXXXXX)
  git worktree add -q --detach "$wt" "$MG_STAGE_BASE"
  if (cd "$wt" && bazel build --jobs="${MG_JOBS:-2}" //bench:bench_models); then
    cp "$wt/bazel-bin/bench/bench_models" .stage/bin/base_bench_bench_models
    git rev-parse --short=12 "$MG_STAGE_BASE" > .stage/BASE_COMMIT
  else
    echo "stage: bench_models did not build at $MG_STAGE_BASE; no base staged"
  fi
  (cd "$wt" && bazel clean --expunge 2>/dev/null) || true
  git worktree remove --force "$wt"
fi
# MG_STAGE_BASE_BINARY=<path> [MG_STAGE_BASE_COMMIT=<rev>]: a bench_models already built from the
# base (the worktree build above costs a cold build on 2 cores).
if [ -n "${MG_STAGE_BASE_BINARY:-}" ]; then
  cp "$MG_STAGE_BASE_BINARY" .stage/bin/base_bench_bench_models
  git rev-parse --short=12 "${MG_STAGE_BASE_COMMIT:-HEAD}" > .stage/BASE_COMMIT
fi
# Debian's Google Benchmark is a shared library; the device image has none.
for so in /usr/lib/x86_64-linux-gnu/libbenchmark.so.1*; do cp -L "$so" .stage/lib/ 2>/dev/null || true; done
# CUPTI for bench_models --profile (PyTorch's wheels may not ship the toolkit's soname).
cp -L /usr/local/cuda/lib64/libcupti.so.13 .stage/lib/ 2>/dev/null || true
# Strip and pack: the binaries share most of their bytes (cudart, kernels), so one xz
# archive keeps the carried tree far under the device tool's 64 MiB; the dictionary spans
# the whole stream so each binary's copy of the kernels compresses against the first.
strip .stage/bin/*
n=$(ls .stage/bin | wc -l)
tar -cf - -C .stage bin | xz --lzma2=preset=6,dict=512MiB > .stage/bin.tar.xz && rm -rf .stage/bin
cp tools/run_staged.sh .stage/run.sh
mkdir -p .stage/pytorch .stage/runner && cp bench/pytorch/*.py .stage/pytorch/ && cp bench/runner/*.py .stage/runner/
git describe --always --dirty --abbrev=12 > .stage/COMMIT 2>/dev/null || true
# examples_gpt2's built-in text (its runfiles do not travel): run it with --data .stage/gpt2_corpus.txt.
cp -L bazel-bin/examples/gpt2_corpus.txt .stage/ 2>/dev/null || true
# The device image has no Debian data sets: carry Fashion-MNIST (30 MB of .gz) when asked.
if [ -n "${MG_STAGE_DATA:-}" ] && [ -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p .stage/fashion-mnist && cp /usr/share/datasets/fashion-mnist/*.gz .stage/fashion-mnist/
fi
du -sh .stage
echo "staged $n binaries into .stage/"
