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
# One random job token, the same for every rank, different for the next job.
tokens=$(echo "$out" | sed -n 's/.*token \([0-9a-f]*\)) ok$/\1/p' | sort -u)
[ "$(echo "$tokens" | wc -l)" -eq 1 ] && [ ${#tokens} -eq 32 ] || { echo "FAIL: tokens '$tokens'"; exit 1; }
again=$("$launch" --nproc 1 -- "$probe" | sed -n 's/.*token \([0-9a-f]*\)) ok$/\1/p')
[ "$again" != "$tokens" ] || { echo "FAIL: two jobs got the same token"; exit 1; }
# Several nodes need one port and one token chosen by the caller; the node rank must exist.
"$launch" --nnodes 2 --node-rank 0 --nproc 1 -- "$probe" 2>/dev/null && { echo "FAIL: --nnodes without a port"; exit 1; }
MG_DIST_TOKEN= "$launch" --nnodes 2 --node-rank 0 --nproc 1 --master-port 29999 -- "$probe" 2>/dev/null &&
  { echo "FAIL: --nnodes without MG_DIST_TOKEN"; exit 1; }
MG_DIST_TOKEN=x "$launch" --nnodes 2 --node-rank 2 --nproc 1 --master-port 29999 -- "$probe" 2>/dev/null &&
  { echo "FAIL: --node-rank 2 of 2 accepted"; exit 1; }
start=$(date +%s)
MG_PROBE_FAIL_RANK=1 MG_PROBE_EXIT_CODE=7 "$launch" --nproc 3 -- "$probe"
rc=$?
took=$(( $(date +%s) - start ))
[ $rc -eq 7 ] || { echo "FAIL: expected exit code 7 from the failing rank, got $rc"; exit 1; }
[ $took -lt 30 ] || { echo "FAIL: the other ranks were not stopped (took ${took}s)"; exit 1; }
"$launch" --nproc 0 -- "$probe" 2>/dev/null && { echo "FAIL: --nproc 0 accepted"; exit 1; }
echo "PASS"
