#!/usr/bin/env bash
# examples:gpt2 on the CPU, seeded: (1) the tiny preset learns: the validation loss starts near
# ln(256) = 5.55 (bytes, uniform) and falls below 4.0 within 120 steps (measured 3.52 here; the
# margin absorbs other summation orders and compilers); (2) a run stopped at step 20 and resumed from its
# checkpoint ends exactly where the uninterrupted run ends; (3) a bad flag is a usage error.
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

full=$(tail -1 < <("$BIN" "${common[@]}" --steps 40 --eval-every 0 --max-new-tokens 0))
"$BIN" "${common[@]}" --steps 40 --eval-every 0 --max-new-tokens 0 --stop-after 20 --save "$TMP/ck.safetensors" >/dev/null
resumed=$(tail -1 < <("$BIN" "${common[@]}" --steps 40 --eval-every 0 --max-new-tokens 0 --resume "$TMP/ck.safetensors"))
for k in val_loss final_train_loss; do
  a=$(field "$full" $k)
  b=$(field "$resumed" $k)
  [ "$a" = "$b" ] || { echo "FAIL: $k after resume $b, uninterrupted $a"; exit 1; }
done
echo "resume: val_loss $(field "$resumed" val_loss) equals the uninterrupted run's"

if "$BIN" --recompute sometimes 2>"$TMP/err"; then echo "FAIL: a bad flag was accepted"; exit 1; fi
grep -q "unknown --recompute" "$TMP/err" || { echo "FAIL: no message naming the flag"; cat "$TMP/err"; exit 1; }
echo PASS
