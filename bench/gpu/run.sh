#!/usr/bin/env bash
# GPU benchmark: meshtrain `train --device cuda --dtype bf16` against PyTorch (eager and
# torch.compile, bench/gpu/torch_gpt2.py) on GPT-2 124M and 350M shapes, seq 1024, in one run
# on one GPU. Prints one table (tokens/s, MFU against the measured bf16 GEMM peak and the
# nominal 989 TFLOP/s, ratios against the goals: >= 1.2x eager, >= 1.0x compile) and writes
# OUTDIR/bench.md (a BENCH.md fragment), OUTDIR/bench.jsonl (every row), OUTDIR/runs.log
# (progress and every sub-run's output).
#
# usage: bench/gpu/run.sh MESHTRAIN [OUTDIR]
#   MESHTRAIN: the binary, or the device bundle's runner `mt` (then `mt meshtrain` is run)
# env: SHAPES="124m 350m"  BATCH=auto|N (auto: the largest of BATCHES that fits PyTorch, then
#      halved until meshtrain fits; both sides run the batch meshtrain fits)
#      BATCHES=64,32,16,8,4,2,1  STEPS=30 MT_WARMUP=5 (meshtrain steps; the first MT_WARMUP
#      are not timed)  TORCH_STEPS=20 TORCH_WARMUP=5  PROFILE_SHAPES=124m PROFILE_STEPS=10
#      ("" for no --profile run)  MODES="eager compile"  MT_ATTENTION=auto|fused|naive  BENCH_BUDGET_S=540 (sub-runs that
#      would not fit are skipped, so the table always prints)
#      DEVICE=cuda (cpu: logic check with SHAPES=tiny)  MT_DEVICE_FLAG=1 (0: omit --device,
#      for a meshtrain that has no --device yet)  PY=python3
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
if [ "$(basename "$1")" = mt ]; then MT=("$1" meshtrain); else MT=("$1"); fi
OUT=${2:-$root/out/gpu-bench}
SHAPES=${SHAPES:-124m 350m}
BATCH=${BATCH:-auto}
BATCHES=${BATCHES:-64,32,16,8,4,2,1}
STEPS=${STEPS:-30}
MT_WARMUP=${MT_WARMUP:-5}
TORCH_STEPS=${TORCH_STEPS:-20}
TORCH_WARMUP=${TORCH_WARMUP:-5}
PROFILE_SHAPES=${PROFILE_SHAPES-124m}
PROFILE_STEPS=${PROFILE_STEPS:-10}
MODES=${MODES:-eager compile}
MT_ATTENTION=${MT_ATTENTION:-auto}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-540}
DEVICE=${DEVICE:-cuda}
MT_DEVICE_FLAG=${MT_DEVICE_FLAG:-1}
PY=${PY:-python3}
command -v "$PY" >/dev/null 2>&1 || PY=/opt/torch/.venv/bin/python3
export PYTHONUNBUFFERED=1
TG=$root/bench/gpu/torch_gpt2.py
REPORT=$root/bench/gpu/report.py
start=$(date +%s)

mkdir -p "$OUT"
jsonl=$OUT/bench.jsonl
: >"$jsonl"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
say() { echo "bench: $*" >&2; echo "bench: $*" >>"$work/progress.log"; }
left() { echo $((BENCH_BUDGET_S - ($(date +%s) - start))); }
# limit S: S, or what the budget leaves minus 15 s for the report; 0 when under MIN (arg 2)
limit() {
  local l=$(( $(left) - 15 ))
  [ "$l" -ge "${2:-20}" ] || { echo 0; return; }
  [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}
record() { echo "$1" >>"$jsonl"; }
record_error() {  # shape kind batch message
  "$PY" -c 'import json, sys; print(json.dumps(dict(kind=sys.argv[2], shape=sys.argv[1], batch=sys.argv[3], error=sys.argv[4])))' \
    "$1" "$2" "$3" "$4" >>"$jsonl"
}

declare -A SHAPE=(  # n_layer n_head d_model vocab seq (meshtrain presets gpt2-124m / gpt2-350m)
  [124m]="12 12 768 50257 1024"
  [350m]="24 16 1024 50257 1024"
  [tiny]="2 4 64 500 64"
)
for s in $SHAPES; do [ -n "${SHAPE[$s]:-}" ] || { say "unknown shape $s (124m, 350m, tiny)"; exit 2; }; done

# ---- the measured bf16 GEMM peak (both sides' MFU use it)
lim=$(limit 120)
peak=""
if [ "$lim" -gt 0 ]; then
  say "bf16 GEMM peak ($DEVICE)"
  peak=$(timeout "$lim" "$PY" "$TG" --device "$DEVICE" --peak-only --out "$jsonl" |
         "$PY" -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l)
    if r.get("kind") == "peak": print(r["tflops"])')
fi
[ -n "$peak" ] || say "no peak measured (MFU against the nominal peak only)"
peak_args=()
[ -z "$peak" ] || peak_args=(--peak-tflops "$peak")
[ -n "$peak" ] && say "peak $peak TFLOP/s"

# ---- random tokens below the vocabulary (llm.c format), enough for every run
tokens=$work/tokens.bin
vocab=50257
for s in $SHAPES; do read -r _ _ _ v _ <<<"${SHAPE[$s]}"; [ "$v" -ge "$vocab" ] || vocab=$v; done
"$PY" - "$tokens" "$vocab" <<'EOF' || { say "cannot write $tokens (numpy?)"; exit 1; }
import sys
import numpy as np
n = 1 << 23  # 8 Mi tokens, 16 MiB: 30 steps x 64 x 1024 = 2 Mi, plus the 5% validation tail
header = np.zeros(256, dtype="<i4")
header[:3] = (20240520, 1, n)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(np.random.default_rng(1).integers(0, int(sys.argv[2]), n).astype("<u2").tobytes())
EOF

# torch_run SHAPE MODE BATCH: one torch_gpt2.py run, rows into bench.jsonl; prints the batch
# of its result row (empty when none)
torch_run() {
  local s=$1 mode=$2 b=$3 lim
  local cap=240
  [ "$mode" != compile ] || cap=420
  lim=$(limit "$cap" 40)
  if [ "$lim" -eq 0 ]; then record_error "$s" skip "$b" "torch $mode: skipped (bench budget)"; return; fi
  say "$s: torch $mode, batch $b (timeout ${lim}s)"
  local log=$work/torch_${s}_${mode}_$b.log
  timeout -k 10 "$lim" "$PY" "$TG" --device "$DEVICE" --shape "$s" --mode "$mode" --batch "$b" \
    --batches "$BATCHES" --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" "${peak_args[@]}" \
    --out "$work/torch.jsonl" >"$log" 2>&1
  local rc=$?
  cat "$log" >>"$work/torch.log"
  grep '^{' "$log" >>"$jsonl"
  [ $rc -eq 0 ] || { say "$s: torch $mode rc $rc: $(grep -v '^{' "$log" | tail -n 3 | tr '\n' ' ')";
                     [ $rc -ne 124 ] || record_error "$s" error "$b" "torch $mode: timeout ${lim}s"; }
  grep '^{' "$log" | "$PY" -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l)
    if r.get("kind") == "result": print(r["batch"])' | tail -n 1
}

# mt_run SHAPE BATCH STEPS LOG [EXTRA...]: meshtrain train; returns its exit status
# (124 when it ran past its time: MT_TIMEOUT, default 240 s)
mt_run() {
  local s=$1 b=$2 steps=$3 log=$4
  shift 4
  read -r L H C V T <<<"${SHAPE[$s]}"
  local dev=()
  [ "$MT_DEVICE_FLAG" = 0 ] || dev=(--device "$DEVICE")
  local pg=()
  [ -z "$peak" ] || pg=(--peak-gflops "$("$PY" -c "print(float('$peak') * 1000)")")
  local lim
  lim=$(limit "${MT_TIMEOUT:-240}" 30)
  [ "$lim" -gt 0 ] || { echo "skipped: bench budget" >"$log"; return 124; }
  local preset=gpt2-$s
  [ "$s" != tiny ] || preset=tiny
  local cmd=("${MT[@]}" train "${dev[@]}" --model "$preset" --dtype bf16 --n-layer "$L" --n-head "$H"
             --d-model "$C" --vocab "$V" --seq "$T" --batch "$b" --microbatch "$b"
             --steps "$steps" --data "$tokens" --eval-batches 1 --attention "$MT_ATTENTION"
             "${pg[@]}" "$@")
  echo "${cmd[*]}" >"$log"
  timeout -k 10 "$lim" "${cmd[@]}" >>"$log" 2>&1
}

profiles=""
for s in $SHAPES; do
  read -r L H C V T <<<"${SHAPE[$s]}"
  # 1. PyTorch's largest batch (eager; its run at that batch is kept as a row)
  modes=" $MODES "
  tb=""
  if [ "$BATCH" = auto ]; then
    tb=$(torch_run "$s" eager auto)
    [ -n "$tb" ] || tb=$(echo "$BATCHES" | cut -d, -f1)
  else
    tb=$BATCH
  fi
  # 2. meshtrain at that batch, halved on out-of-memory
  mb=$tb
  mt_batch=""
  while [ "$mb" -ge 1 ]; do
    say "$s: meshtrain batch $mb, $STEPS steps"
    log=$work/mt_${s}_$mb.log
    metrics=$work/mt_${s}_$mb.jsonl
    mt_run "$s" "$mb" "$STEPS" "$log" --metrics "$metrics"
    rc=$?
    cat "$log" >>"$work/meshtrain.log"
    if [ $rc -eq 0 ]; then mt_batch=$mb; break; fi
    if grep -qi 'out of memory\|cudaErrorMemoryAllocation' "$log" && [ "$BATCH" = auto ]; then
      say "$s: meshtrain out of memory at batch $mb"
      mb=$((mb / 2))
      [ "$mb" -ge 1 ] || record_error "$s" meshtrain-error 1 "out of memory at every batch"
      continue
    fi
    say "$s: meshtrain failed (rc $rc): $(tail -n 3 "$log" | tr '\n' ' ')"
    record_error "$s" meshtrain-error "$mb" "rc $rc: $(grep -m1 -i 'error' "$log" | cut -c1-300)"
    break
  done
  if [ -n "$mt_batch" ]; then
    "$PY" "$REPORT" meshtrain-row "$metrics" --shape "$s" --batch "$mt_batch" \
      --warmup "$MT_WARMUP" "${peak_args[@]}" >>"$jsonl" ||
      record_error "$s" meshtrain-error "$mt_batch" "cannot read $metrics"
  fi
  # 3. PyTorch at meshtrain's batch (eager again only when it differs), compile
  same=${mt_batch:-$tb}
  if [[ $modes == *" eager "* ]] && { [ "$BATCH" != auto ] || [ "$same" != "$tb" ]; }; then
    torch_run "$s" eager "$same" >/dev/null
  fi
  [[ $modes != *" compile "* ]] || torch_run "$s" compile "$same" >/dev/null
  # 4. where the time goes (meshtrain --profile), short
  if [ -n "$mt_batch" ] && [[ " $PROFILE_SHAPES " == *" $s "* ]]; then
    say "$s: meshtrain --profile, batch $mt_batch, $PROFILE_STEPS steps"
    plog=$work/profile_$s.log
    if mt_run "$s" "$mt_batch" "$PROFILE_STEPS" "$plog" --profile; then
      p=$("$PY" "$REPORT" profile "$plog")
      profiles+="$s, batch $mt_batch, $PROFILE_STEPS steps:"$'\n'"$p"$'\n'
    else
      say "$s: --profile run failed: $(tail -n 2 "$plog" | tr '\n' ' ')"
    fi
    cat "$plog" >>"$work/meshtrain.log"
  fi
done

# ---- the table
{
  echo "=== progress"; cat "$work/progress.log" 2>/dev/null
  echo "=== meshtrain runs"; cat "$work/meshtrain.log" 2>/dev/null
  echo "=== torch runs"; cat "$work/torch.log" 2>/dev/null
} >"$OUT/runs.log"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')
[ -z "${MT_BUNDLE:-}" ] || commit=$(sed -n 's/^commit: *//p' "$MT_BUNDLE/MANIFEST.txt" 2>/dev/null || echo "$commit")
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$device" ] || device=$DEVICE
# Which attention kernel meshtrain ran (its start-up line names it).
att=$(grep -m1 -o 'fused attention\|naive attention' "$work/meshtrain.log" 2>/dev/null)
[ -z "$att" ] || device+="; meshtrain: $att (--attention $MT_ATTENTION)"
echo
[ -z "$profiles" ] || { echo "meshtrain --profile (host-side scopes: see the note in docs/cuda-device-session.md):"; echo "$profiles"; }
"$PY" "$REPORT" table "$jsonl" --md "$OUT/bench.md" --device "$device" --commit "$commit" \
  --date "$(date -u '+%Y-%m-%d %H:%M UTC')" --profile "$profiles"
echo "bench: $(( $(date +%s) - start )) s; $OUT/bench.md, bench.jsonl, runs.log" >&2
grep -q '"kind": *"meshtrain"' "$jsonl"
