#!/usr/bin/env bash
# Sets up (tools/setup.sh), runs every test with Bazel, then prints the plain summary line
# "N passed, M failed, K skipped" counted from the gtest XML results (not Bazel's summary:
# a GPU test that skips shows as PASSED there).
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
CONFIG=()
[ -n "${CI:-}" ] && CONFIG+=(--config=ci)
[ -n "${MG_BAZEL_CONFIG:-}" ] && CONFIG+=("--config=${MG_BAZEL_CONFIG}")
log=$(mktemp)
bazel test "${CONFIG[@]}" --jobs="${MG_JOBS:-2}" //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
python3 tools/count_tests.py bazel-testlogs "$log"
exit $rc
