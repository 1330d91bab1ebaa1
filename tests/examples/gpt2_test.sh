#!/usr/bin/env bash
# examples:gpt2 on the CPU, seeded: (1) the tiny preset learns: the validation loss starts near
# ln(256) = 5.55 (bytes, uniform) and falls below 4.0 within 120 steps (measured 3.52 here; the
# margin absorbs other summation orders and compilers); (2) a run stopped at step 20 and resumed from its
# checkpoint ends exactly where the uninterrupted run ends, also under FP8 delayed scaling; (3) --memory-budget fits or names the
# smallest peak; (4) ZeRO-2 and ZeRO-3 on two ranks train as DDP does, and ZeRO-3 resumes exactly;
# (5) a bad flag is a usage error.
set -euo pipefail
BIN="${TEST_SRCDIR}/${TEST_WORKSPACE:-memgrad}/examples/gpt2"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
common=(--preset tiny --device cpu --no-progress --seed 0 --eval-iters 4)

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

out=$("$BIN" "${common[@]}" --steps 120 --eval-every 60 --max-new-tokens 16)
echo "$out" | grep -E "^step|^peak"
json=$(tail -1 <<<"$out")
initial=$(field "$json" initial_val_loss)
final=$(field "$json" val_loss)
echo "validation loss: $initial -> $final"
python3 -c "import sys; i, f = map(float, sys.argv[1:]); sys.exit(0 if 5.3 < i < 5.8 and f < 4.0 else 1)" \
  "$initial" "$final" || { echo "FAIL: expected ~5.55 falling below 4.0"; exit 1; }
grep -q -- "--- sample ---" <<<"$out" || { echo "FAIL: no sample printed"; exit 1; }

# check_resume LABEL FLAGS...: a run stopped at step 20 and resumed from its checkpoint ends with
# the uninterrupted run's losses, to the bit.
check_resume() {
  local label=$1 full resumed a b k
  shift
  full=$(tail -1 < <("$BIN" "${common[@]}" "$@"))
  "$BIN" "${common[@]}" "$@" --stop-after 20 --save "$TMP/ck.safetensors" >/dev/null
  resumed=$(tail -1 < <("$BIN" "${common[@]}" "$@" --resume "$TMP/ck.safetensors"))
  for k in val_loss final_train_loss; do
    a=$(field "$full" $k)
    b=$(field "$resumed" $k)
    [ "$a" = "$b" ] || { echo "FAIL: $label: $k after resume $b, uninterrupted $a"; exit 1; }
  done
  echo "resume ($label): val_loss $(field "$resumed" val_loss) equals the uninterrupted run's"
}
check_resume "f32" --steps 40 --eval-every 0 --max-new-tokens 0
# Under the FP8 recipe with delayed scaling and every block checkpointed, the histories of each
# layer's amaxes travel in the checkpoint, so the resumed run casts with the same scales.
check_resume "FP8 delayed" --steps 40 --eval-every 0 --max-new-tokens 0 --amp bf16 --fp8 --fp8-min-features 0 \
  --fp8-delayed --fp8-fast-accum --recompute per-block

# --memory-budget: a roomy budget keeps no recomputation and trains; one below every rung's peak
# stops before training with the smallest peak named (exit 1); with --recompute it is a usage error.
out=$("$BIN" "${common[@]}" --steps 2 --eval-every 0 --max-new-tokens 0 --memory-budget 1GiB)
grep -q "^fits: no recomputation, peak" <<<"$out" || { echo "FAIL: 1GiB should fit without recomputation"; echo "$out"; exit 1; }
grep -q "recompute no recomputation" <<<"$out" || { echo "FAIL: the banner does not name the chosen mode"; exit 1; }
field "$(tail -1 <<<"$out")" val_loss >/dev/null
if "$BIN" "${common[@]}" --steps 2 --eval-every 0 --max-new-tokens 0 --memory-budget 1KiB >"$TMP/out" 2>"$TMP/err"; then
  echo "FAIL: a 1 KiB budget was accepted"; exit 1
fi
grep -q "does not fit: the smallest peak is" "$TMP/err" || { echo "FAIL: no smallest peak named"; cat "$TMP/err"; exit 1; }
grep -q "checkpoint 2 blocks selective gelu head chunk 2048 casts per use:" "$TMP/out" || { echo "FAIL: not every rung tried"; cat "$TMP/out"; exit 1; }
# Between the smallest rungs with AdamW's f32 moments (8.60 MiB measured here) and with 8-bit
# moments (8.12 MiB for the first checkpointing rung): no AdamW rung fits, an 8-bit one does, and
# the run trains with adamw8bit.
out=$("$BIN" "${common[@]}" --steps 2 --eval-every 0 --max-new-tokens 0 --memory-budget 8.36MiB)
grep -q "training with adamw8bit (8-bit moments)" <<<"$out" || { echo "FAIL: the budget did not switch to 8-bit state"; echo "$out"; exit 1; }
grep -q "adamw8bit lr" <<<"$out" || { echo "FAIL: the run did not train with adamw8bit"; echo "$out"; exit 1; }
echo "memory budget 8.36 MiB: no AdamW rung fits, AdamW8bit with $(grep -o 'recompute checkpoint[^,]*' <<<"$out" | head -1)"
if "$BIN" --memory-budget 1GiB --recompute per-block 2>"$TMP/err"; then echo "FAIL: --memory-budget with --recompute"; exit 1; fi
grep -q "drop --recompute" "$TMP/err" || { echo "FAIL: no message for --memory-budget with --recompute"; cat "$TMP/err"; exit 1; }
echo "memory budget: 1GiB fits without recomputation; 1KiB names the smallest peak"
# The offload modes: --memory-budget says why it does not try them here; --offload names the flag
# that rules it out (each host update runs inside backward) or the device it needs.
grep -q "optimizer and parameter offload not tried (the update runs inside backward" "$TMP/out" ||
  { echo "FAIL: the budget does not say why it skipped the offload modes"; cat "$TMP/out"; exit 1; }
expect_error() {  # expect_error MESSAGE FLAGS...: the run fails before training, saying MESSAGE
  local msg=$1; shift
  if "$BIN" "${common[@]}" --steps 1 --eval-every 0 --max-new-tokens 0 "$@" >"$TMP/out" 2>"$TMP/err"; then
    echo "FAIL: $* was accepted"; exit 1
  fi
  grep -qF -- "$msg" "$TMP/err" || { echo "FAIL: $* did not say: $msg"; cat "$TMP/err"; exit 1; }
}
expect_error 'unknown --offload "host" (valid: none, optimizer, params)' --offload host
expect_error "--fp8-fast-accum is an accumulation for --fp8: give --fp8 too" --amp bf16 --fp8-fast-accum
expect_error "--offload optimizer: the update runs inside backward, before the global gradient norm exists: pass --clip-grad-norm 0" \
  --offload optimizer --amp bf16
expect_error "--offload params: the device computes with bf16 copies of the host's masters: pass --amp bf16" \
  --offload params --clip-grad-norm 0
expect_error "--offload params: each gradient updates its parameter as it comes home: --grad-accum must be 1" \
  --offload params --clip-grad-norm 0 --amp bf16 --grad-accum 2
expect_error "--offload params: the model stays in host memory until training starts" \
  --offload params --clip-grad-norm 0 --amp bf16 --auto-batch
expect_error "--offload-optimizer-blocks goes with --offload optimizer, got --offload params" \
  --offload params --offload-optimizer-blocks 4
expect_error "--offload-optimizer-blocks must be >= 1, got 0" --offload optimizer --offload-optimizer-blocks 0
expect_error "--offload-optimizer-blocks goes with --offload optimizer, got --offload none" --offload-optimizer-blocks auto
expect_error "--offload-optimizer-ratio must be >= 1, got 0.5" --offload optimizer --offload-optimizer-blocks auto \
  --offload-optimizer-ratio 0.5
expect_error "--memory-budget chooses where the state lives itself; drop --offload optimizer" \
  --offload optimizer --memory-budget 1GiB
expect_error "--offload optimizer keeps the state in this process's host memory for one CUDA device; got cpu" \
  --offload optimizer --clip-grad-norm 0 --amp bf16
out=$("$BIN" "${common[@]}" --steps 1 --eval-every 0 --max-new-tokens 0 --memory-budget 1GiB --clip-grad-norm 0 --amp bf16)
grep -q "optimizer and parameter offload not tried (needs a CUDA device)" <<<"$out" ||
  { echo "FAIL: the budget on the CPU does not say the offload modes need a CUDA device"; echo "$out"; exit 1; }
echo "offload: each conflicting flag named"

if "$BIN" --offload-blocks -1 2>"$TMP/err"; then echo "FAIL: --offload-blocks -1 was accepted"; exit 1; fi
grep -q -- "--offload-blocks must be >= 0 or auto, got -1" "$TMP/err" || { echo "FAIL: no message for --offload-blocks -1"; cat "$TMP/err"; exit 1; }
# With offloaded blocks the ladder names them (on the CPU offload copies nothing; the rungs still run).
"$BIN" "${common[@]}" --steps 1 --eval-every 0 --max-new-tokens 0 --memory-budget 1KiB --offload-blocks 1 >"$TMP/out" 2>"$TMP/err" && {
  echo "FAIL: a 1 KiB budget was accepted with --offload-blocks"; exit 1; }
grep -q "checkpoint 1 blocks selective gelu head chunk 2048 offload 1 blocks casts per use:" "$TMP/out" || {
  echo "FAIL: the offload ladder's rungs are not named"; cat "$TMP/out"; exit 1; }
# --offload-blocks auto plans from the host link: on the CPU there is none, so nothing is offloaded.
out=$("$BIN" "${common[@]}" --steps 1 --eval-every 0 --max-new-tokens 0 --offload-blocks auto)
grep -q "^--offload-blocks auto: offload 0 of 2 segments" <<<"$out" || { echo "FAIL: no offload plan printed"; echo "$out"; exit 1; }
# Planning profiles the blocks, whose dropout draws from the default generator: the state is
# restored, so a run that plans (offload, or the checkpoint planner) trains as a plain run does.
drop=(--dropout 0.1 --steps 2 --eval-every 0 --max-new-tokens 0)
plain=$(field "$("$BIN" "${common[@]}" "${drop[@]}" | tail -1)" val_loss)
# Blocks checkpointed keeping their MLP outputs replay the same dropout masks: the same loss too.
for planned in "--offload-blocks auto" "--recompute planner:60%" "--recompute per-block-keep"; do
  got=$(field "$("$BIN" "${common[@]}" "${drop[@]}" $planned | tail -1)" val_loss)
  [ "$got" = "$plain" ] || { echo "FAIL: with $planned val_loss $got, plain $plain"; exit 1; }
done
if "$BIN" --offload-blocks many 2>"$TMP/err"; then echo "FAIL: --offload-blocks many was accepted"; exit 1; fi
grep -q -- "--offload-blocks" "$TMP/err" || { echo "FAIL: no message for --offload-blocks many"; cat "$TMP/err"; exit 1; }
echo "offload blocks: a negative count or a word other than auto is refused; auto plans 0 blocks on the CPU and, like the checkpoint planner, trains as a plain run does (dropout on); the ladder checkpoints the blocks after the offloaded one"

# ZeRO-2 on two CPU ranks trains as DDP does, gradient clipping included: the same gradients,
# averaged by a reduce-scatter instead of an all-reduce, their norm summed from the slices
# (other summation orders: f32 roundings apart, far below 1e-3).
zero=(--nproc 2 --steps 6 --eval-every 0 --max-new-tokens 0 --clip-grad-norm 0.5)  # clipped from the slices
ddp_loss=$(field "$("$BIN" "${common[@]}" "${zero[@]}" | tail -1)" val_loss)
z2=$("$BIN" "${common[@]}" "${zero[@]}" --zero-stage 2 | tail -1)
[ "$(field "$z2" zero_stage)" = "2" ] || { echo "FAIL: --zero-stage 2 did not run ZeRO-2: $z2"; exit 1; }
python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-3 * abs(a) else 1)" \
  "$ddp_loss" "$(field "$z2" val_loss)" || { echo "FAIL: ZeRO-2 val_loss $(field "$z2" val_loss), DDP $ddp_loss"; exit 1; }
# ZeRO-3 the same: the gathered parameters are the shards' values, the gradients averaged by a
# reduce-scatter; a sample at the end gathers the whole model on every rank first.
z3=$("$BIN" "${common[@]}" "${zero[@]}" --zero-stage 3 --max-new-tokens 4 | tail -1)
[ "$(field "$z3" zero_stage)" = "3" ] || { echo "FAIL: --zero-stage 3 did not run ZeRO-3: $z3"; exit 1; }
python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-3 * abs(a) else 1)" \
  "$ddp_loss" "$(field "$z3" val_loss)" || { echo "FAIL: ZeRO-3 val_loss $(field "$z3" val_loss), DDP $ddp_loss"; exit 1; }
# A ZeRO-3 run stopped at step 3 and resumed from its checkpoint (the state gathered from the
# shards) ends exactly where the uninterrupted run ends; the same file resumes in one process.
z3_full=$("$BIN" "${common[@]}" "${zero[@]}" --zero-stage 3 | tail -1)
"$BIN" "${common[@]}" "${zero[@]}" --zero-stage 3 --stop-after 3 --save "$TMP/z3.safetensors" >/dev/null
z3_resumed=$("$BIN" "${common[@]}" "${zero[@]}" --zero-stage 3 --resume "$TMP/z3.safetensors" | tail -1)
# The shards in host memory (--zero-offload): on the CPU backend the same ops on the same memory,
# so the same val_loss to the last digit.
z3_off=$("$BIN" "${common[@]}" "${zero[@]}" --zero-stage 3 --zero-offload | tail -1)
[ "$(field "$z3_off" zero_offload)" = "True" ] || { echo "FAIL: --zero-offload not reported: $z3_off"; exit 1; }
[ "$(field "$z3_full" val_loss)" = "$(field "$z3_off" val_loss)" ] ||
  { echo "FAIL: ZeRO-3 with host shards val_loss $(field "$z3_off" val_loss), on the device $(field "$z3_full" val_loss)"; exit 1; }
if "$BIN" --zero-offload --zero-stage 2 2>"$TMP/err"; then echo "FAIL: --zero-offload with stage 2 was accepted"; exit 1; fi
grep -q -- "--zero-offload keeps ZeRO-3's shards in host memory: it needs --zero-stage 3, got 2" "$TMP/err" ||
  { echo "FAIL: no message for --zero-offload with stage 2"; cat "$TMP/err"; exit 1; }
[ "$(field "$z3_full" val_loss)" = "$(field "$z3_resumed" val_loss)" ] ||
  { echo "FAIL: ZeRO-3 val_loss after resume $(field "$z3_resumed" val_loss), uninterrupted $(field "$z3_full" val_loss)"; exit 1; }
one=$("$BIN" "${common[@]}" --steps 6 --eval-every 0 --max-new-tokens 0 --clip-grad-norm 0.5 --resume "$TMP/z3.safetensors")
grep -q "resumed from $TMP/z3.safetensors at step 3" <<<"$one" || { echo "FAIL: one process did not resume the ZeRO-3 checkpoint: $one"; exit 1; }
echo "ZeRO-3 resume: val_loss $(field "$z3_resumed" val_loss) equals the uninterrupted run's; one process resumes the same file"
if "$BIN" --zero-stage 4 2>"$TMP/err"; then echo "FAIL: --zero-stage 4 was accepted"; exit 1; fi
grep -q -- "--zero-stage must be 1, 2 or 3, got 4" "$TMP/err" || { echo "FAIL: no message for --zero-stage 4"; cat "$TMP/err"; exit 1; }
echo "zero stages 2 and 3: two ranks end at val_loss $(field "$z2" val_loss) and $(field "$z3" val_loss), DDP at $ddp_loss"

if "$BIN" --recompute sometimes 2>"$TMP/err"; then echo "FAIL: a bad flag was accepted"; exit 1; fi
grep -q "unknown --recompute" "$TMP/err" || { echo "FAIL: no message naming the flag"; cat "$TMP/err"; exit 1; }
echo PASS
