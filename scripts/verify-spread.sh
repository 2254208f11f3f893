#!/usr/bin/env bash
# The spread `meshtrain verify` sees on correct layouts, which its default tolerances are
# derived from (docs/verify.md): every layout below against its oracle, f32 and bf16
# (`verify --json`, default steps 20, tolerances off so that every number is printed), and
# the bf16 single rank against the f32 single rank (bf16 rounding itself, for scale).
# Prints one markdown table (the worst over the steps; the update ratio's worst tensor).
#
# usage: scripts/verify-spread.sh [MESHTRAIN] [DATA]   (default build/release/meshtrain,
#        data/demo.bin)   env: LAYOUTS (one per line), STEPS=20, MODEL=tiny
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
MT=${1:-$root/build/release/meshtrain}
DATA=${2:-$root/data/demo.bin}
STEPS=${STEPS:-20}
MODEL=${MODEL:-tiny}
LAYOUTS=${LAYOUTS:-"--dp 2
--dp 2 --zero 3
--tp 2
--tp 2 --sp
--pp 2 --microbatches 4
--dp 2 --tp 2 --zero 1
--tp 2 --pp 2 --microbatches 4 --schedule zb1"}
[ -x "$MT" ] || { echo "verify-spread: no $MT (make build)" >&2; exit 2; }
[ -f "$DATA" ] || { echo "verify-spread: no $DATA (make data/demo.bin)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/verify-spread.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Tolerances as loose as allowed: verify exits 0 and its JSON holds every number.
loose=(--tol-loss 1e9 --tol-norm 1e9 --tol-param 1e9 --tol-update 1e9)
echo "Command: \`scripts/verify-spread.sh\` (model $MODEL, $(basename "$DATA"), $STEPS steps; meshtrain $(git -C "$root" rev-parse --short HEAD), $(date -u '+%Y-%m-%d'))"
echo
echo "| layout | dtype | loss, rel | grad norm, rel | parameter, abs | update ratio (tensor) |"
echo "| --- | --- | --- | --- | --- | --- |"
while IFS= read -r L; do
  [ -n "$L" ] || continue
  for dt in f32 bf16; do
    # shellcheck disable=SC2086
    "$MT" verify --model "$MODEL" --data "$DATA" --steps "$STEPS" $L --dtype "$dt" \
        "${loose[@]}" --json >"$work/v.json" 2>"$work/v.log" ||
      { tail -n 5 "$work/v.log" >&2; echo "verify-spread: verify $L --dtype $dt failed" >&2; exit 1; }
    python3 - "$work/v.json" "$L" "$dt" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p = j["params"] or {}
upd = f"{p['update_rel_diff']:.1e} ({p['update_name']})" if "update_rel_diff" in p else "-"
pa = f"{p['abs_diff']:.1e}" if p else "-"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {j['worst_loss_rel_diff']:.1e} | "
      f"{j['worst_grad_norm_rel_diff']:.1e} | {pa} | {upd} |")
PY
  done
done <<<"$LAYOUTS"
# bf16 rounding itself: the bf16 single rank against the f32 single rank.
for dt in f32 bf16; do
  "$MT" train --model "$MODEL" --data "$DATA" --steps "$STEPS" --dtype "$dt" \
      --metrics "$work/$dt.jsonl" >/dev/null 2>&1
done
python3 - "$work/f32.jsonl" "$work/bf16.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) and a, "the two runs' step counts differ"
loss = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
norm = max(abs(x["grad_norm"] - y["grad_norm"]) / x["grad_norm"] for x, y in zip(a, b))
print(f"| 1 rank, bf16 against f32 (rounding itself) | - | {loss:.1e} | {norm:.1e} | - | - |")
PY
