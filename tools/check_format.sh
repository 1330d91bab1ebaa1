#!/usr/bin/env bash
# Fails when a C++/CUDA file changed since BASE (default: the previous commit) is not formatted
# as .clang-format says. CI runs it; `tools/check_format.sh --fix` formats those files instead.
set -uo pipefail
cd "$(dirname "$0")/.."
fix=0
[ "${1:-}" = "--fix" ] && fix=1 && shift
base=${1:-HEAD~1}
git rev-parse -q --verify "$base" >/dev/null || base=$(git rev-list --max-parents=0 HEAD | tail -1)
files=$(git diff --name-only --diff-filter=ACMR "$base" -- '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^third_party/' || true)
[ -z "$files" ] && { echo "format: no C++ files changed since $base"; exit 0; }
if ! command -v clang-format >/dev/null; then echo "format: clang-format not installed"; exit 1; fi
if [ $fix = 1 ]; then clang-format -i $files; exit 0; fi
bad=0
for f in $files; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then echo "format: $f is not clang-formatted"; bad=1; fi
done
[ $bad = 0 ] && echo "format: $(echo $files | wc -w) changed files are formatted"
exit $bad
