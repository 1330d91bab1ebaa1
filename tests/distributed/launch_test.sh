#!/usr/bin/env bash
# tools/launch: starts N ranks with the rendezvous environment; a failing rank's exit code is
# returned and the ranks still waiting for it are stopped (well before their 60 s timeout).
set -uo pipefail
launch=$1
probe=$2
out=$("$launch" --nproc 3 -- "$probe")
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: 3 healthy ranks exited with $rc"; exit 1; }
[ "$(echo "$out" | grep -c ' ok$')" -eq 3 ] || { echo "FAIL: expected 3 ranks to report ok"; exit 1; }
echo "$out" | grep -q "NCCL_NVLS_ENABLE=0" || { echo "FAIL: NCCL_NVLS_ENABLE not set to 0"; exit 1; }
start=$(date +%s)
MG_PROBE_FAIL_RANK=1 MG_PROBE_EXIT_CODE=7 "$launch" --nproc 3 -- "$probe"
rc=$?
took=$(( $(date +%s) - start ))
[ $rc -eq 7 ] || { echo "FAIL: expected exit code 7 from the failing rank, got $rc"; exit 1; }
[ $took -lt 30 ] || { echo "FAIL: the other ranks were not stopped (took ${took}s)"; exit 1; }
"$launch" --nproc 0 -- "$probe" 2>/dev/null && { echo "FAIL: --nproc 0 accepted"; exit 1; }
echo "PASS"
