#!/usr/bin/env bash
# The CMake build in CI: configures the CPU-only build (-DMEMGRAD_CUDA=OFF), builds the library,
# the main job and the tests, runs every test through ctest (as tools/test.sh runs every Bazel
# test: the ones labelled gpu skip their GPU cases) and the main job for one short epoch,
# installs to a temporary prefix, then builds and runs examples/embed_cmake against it twice:
# through find_package(memgrad CONFIG) and through FetchContent of this tree. Prints the time of
# each step and ends with the tests' line "N passed, M failed, K skipped" (gtest cases); exits
# non-zero if any step failed.
#
#   bash tools/cmake_ci.sh [CTEST_ARGS...]      e.g. -L small for the quick subset, -LE gpu
#
# Compiles go through ccache when it is installed (tools/setup.sh installs it), cached in
# ~/.cache/memgrad-ccache outside the clone (CCACHE_DIR overrides), so a fresh clone rebuilds from
# the cache. The build trees are under build/ (git-ignored), MG_CMAKE_JOBS compiles at a time
# (default 2).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=$ROOT/build/cmake
EMBED=$ROOT/build/embed
JOBS=${MG_CMAKE_JOBS:-2}
PREFIX=$(mktemp -d /tmp/memgrad-install.XXXXXX)
trap 'rm -rf "$PREFIX"' EXIT
rm -rf "$B" "$EMBED" "$ROOT/build/memgrad-build" "$ROOT/build/memgrad-subbuild"
mkdir -p "$ROOT/build"

LAUNCHER=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/memgrad-ccache}
  # Paths under the clone become relative, so another clone's path still hits the cache; the
  # FetchContent build of memgrad (build/memgrad-build) sits as deep as build/cmake for the same
  # reason.
  export CCACHE_BASEDIR=$ROOT
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  ccache -z >/dev/null
fi

start=$(date +%s)
step_start=$start
rc=0
step() {
  local now
  now=$(date +%s)
  echo "cmake ci: $1 in $((now - step_start)) s"
  step_start=$now
}
fail() {
  echo "cmake ci: FAILED: $1"
  rc=1
}

cmake -S . -B "$B" -DMEMGRAD_CUDA=OFF "${LAUNCHER[@]}" >"$ROOT/build/cmake-configure.log" 2>&1 ||
  { cat "$ROOT/build/cmake-configure.log"; fail "configure"; }
step "configure"
built=0
if [ $rc -eq 0 ]; then
  cmake --build "$B" -j "$JOBS" >"$ROOT/build/cmake-build.log" 2>&1 && built=1 ||
    { grep -E -B2 -A8 "error|Error" "$ROOT/build/cmake-build.log" | head -80; fail "build"; }
fi
step "build (library, main job, tests)"
command -v ccache >/dev/null && ccache -s | grep -E "Hits|Misses" | tr -s ' ' | tr '\n' ' ' && echo

if [ $built -eq 1 ]; then
  ctest --test-dir "$B" -j "$JOBS" --output-on-failure "$@" || fail "ctest"
  step "ctest"
fi
summary=$(python3 tools/count_tests.py "$B/testlogs" 2>/dev/null | tail -1)
# A test binary that failed without a failing case in its XML (a crash, a timeout) counts as one.
extra=0
if [ -f "$B/Testing/Temporary/LastTestsFailed.log" ]; then
  while IFS=: read -r _ name; do
    xml="$B/testlogs/$(echo "${name#//}" | tr ':' '/')/test.xml"
    grep -q "<failure" "$xml" 2>/dev/null || extra=$((extra + 1))
  done <"$B/Testing/Temporary/LastTestsFailed.log"
fi

# The main job trains one short epoch on the CPU (where the data set is installed).
if [ $built -eq 1 ] && { [ -d /usr/share/datasets/fashion-mnist ] || [ -n "${MG_FASHION_MNIST:-}" ]; }; then
  out=$("$B/bin/examples/fashion_mnist" --device cpu --limit-train 2048 --epochs 1 --no-progress 2>&1) ||
    { echo "$out" | tail -5; fail "the main job"; }
  grep "^epoch" <<<"$out"
  step "main job (one short epoch)"
fi

# find_package(memgrad CONFIG) against the install, then FetchContent of this source tree.
if [ $built -eq 1 ]; then
  cmake --install "$B" --prefix "$PREFIX" >/dev/null || fail "install"
  step "install"
  { cmake -S examples/embed_cmake -B "$EMBED/package" -DCMAKE_PREFIX_PATH="$PREFIX" "${LAUNCHER[@]}" >/dev/null &&
    cmake --build "$EMBED/package" -j "$JOBS" >/dev/null && "$EMBED/package/train_two_layer"; } ||
    fail "examples/embed_cmake with find_package"
  step "embed_cmake (find_package)"
  { cmake -S examples/embed_cmake -B "$EMBED/source" -DMEMGRAD_FROM=SOURCE -DMEMGRAD_CUDA=OFF \
      -DFETCHCONTENT_BASE_DIR="$ROOT/build" "${LAUNCHER[@]}" >/dev/null &&
    cmake --build "$EMBED/source" -j "$JOBS" >/dev/null && "$EMBED/source/train_two_layer"; } ||
    fail "examples/embed_cmake with FetchContent"
  step "embed_cmake (FetchContent)"
fi

echo "cmake ci: $(($(date +%s) - start)) s in all"
[ -n "$summary" ] || summary="0 passed, 0 failed, 0 skipped"
read -r passed _ failed _ skipped _ <<<"${summary//,/}"
failed=$((failed + extra))
[ $rc -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "$passed passed, $failed failed, $skipped skipped"
exit $rc
