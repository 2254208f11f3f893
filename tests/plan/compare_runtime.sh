#!/bin/bash
# Calibrate this host, then for each layout: the planner's predicted step time and peak
# memory (simulate --cluster this-host --dtype f32) vs the runtime's measured ones (best
# step time of steps 3..N, the allocator's peak). Prints a markdown table: the local backend
# (rank threads) first, then, when mpirun is installed, MPI (one process per rank, the host
# calibrated with `mpirun -np 8 --oversubscribe meshtrain calibrate --backend mpi`: the
# host, and MPI's all-reduce at 2, 4 and 8 processes).
# The host is shared and noisy in bursts: each layout trains RUNS times (the best step over
# all of them counts; rounds over all layouts) and the host is calibrated twice (the faster
# calibration counts).
# Usage: tests/plan/compare_runtime.sh BUILD_DIR [STEPS] [RUNS]
set -euo pipefail
B=${1:-build/plan}/meshtrain
STEPS=${2:-16}
RUNS=${3:-2}
W=$(mktemp -d)
python3 - "$W" <<'PY'
import sys, os
out = os.path.join(sys.argv[1], "demo.bin")
data = b"".join(open(os.path.join("/usr/share/common-licenses", f), "rb").read()
                for f in sorted(os.listdir("/usr/share/common-licenses"))
                if os.path.isfile(os.path.join("/usr/share/common-licenses", f)))
import struct
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, len(data)
with open(out, "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % len(data), *data))
PY
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MODEL="--model tiny --n-layer 4 --d-model 256 --n-head 4 --seq 128"
LOCAL_LAYOUTS=("--dp 2 --zero 0" "--dp 2 --zero 1" "--dp 2 --zero 2" "--dp 2 --zero 3"
  "--dp 8 --zero 0" "--dp 8 --zero 1" "--dp 8 --zero 3" "--dp 2 --zero 0 --microbatch 4"
  "--dp 1 --pp 2 --microbatches 4" "--dp 4 --pp 2 --microbatches 2"
  "--dp 2 --pp 4 --microbatches 4" "--dp 1 --pp 2 --microbatches 4 --schedule gpipe"
  "--dp 1 --tp 2" "--dp 1 --tp 2 --sp" "--dp 4 --tp 2 --sp" "--dp 2 --zero 0 --recompute full"
  "--dp 1 --pp 2 --microbatches 4 --schedule zb1"
  "--dp 1 --pp 2 --microbatches 4 --schedule interleaved --virtual-stages 2"
  "--dp 2 --tp 2 --pp 2 --microbatches 4")
MPI_LAYOUTS=("--dp 2 --zero 0" "--dp 2 --zero 1" "--dp 8 --zero 0" "--dp 8 --zero 1"
  "--dp 1 --pp 2 --microbatches 4" "--dp 2 --pp 4 --microbatches 4" "--dp 1 --tp 2"
  "--dp 4 --tp 2 --sp")

# ranks LAYOUT: dp x pp x tp.
ranks() {
  local L=$1 DP PP=1 TP=1
  DP=$(echo "$L" | sed -E 's/.*--dp ([0-9]+).*/\1/')
  if [[ "$L" == *"--pp "* ]]; then PP=$(echo "$L" | sed -E 's/.*--pp ([0-9]+).*/\1/'); fi
  if [[ "$L" == *"--tp "* ]]; then TP=$(echo "$L" | sed -E 's/.*--tp ([0-9]+).*/\1/'); fi
  echo $((DP * PP * TP))
}

# key BACKEND LAYOUT: a file-name-safe name for the pair.
key() { echo "$1 $2" | tr -c 'a-z0-9\n' '_'; }

# measure BACKEND LAYOUT ROUND: one training run's metrics into $W/<key>.<ROUND>.jsonl.
measure() {
  local backend=$1 L=$2 round=$3 N
  N=$(ranks "$L")
  local run=("$B")
  if [ "$backend" = mpi ]; then run=(mpirun -np "$N" --oversubscribe "$B"); fi
  "${run[@]}" train $MODEL $L --backend "$backend" --batch 16 --steps "$STEPS" \
      --data "$W/demo.bin" --peak-gflops 100 --metrics "$W/$(key "$backend" "$L").$round.jsonl" \
      --eval-every 0 >/dev/null 2>&1 || true
}

# report BACKEND HOST_JSON LAYOUT: one table row from every round's metrics.
report() {
  local backend=$1 host=$2 L=$3 N
  N=$(ranks "$L")
  "$B" simulate $MODEL $L --batch 16 --gpus "$N" --cluster "$host" --dtype f32 --json \
      2>/dev/null >"$W/s.json"
  python3 - "$W" "$(key "$backend" "$L")" "$backend $L" "$N" <<'PY'
import glob, json, sys
w, key, L, n = sys.argv[1:5]
# The best step after two warm-up steps of every run: like calibrate's best-of, the least
# disturbed by other processes on a shared host.
meas, peak = float("inf"), 0
for f in glob.glob(f"{w}/{key}.*.jsonl"):
    rows = [json.loads(l) for l in open(f)]
    if len(rows) < 4:
        continue
    meas = min(meas, min(r["time_s"] for r in rows[2:]))
    peak = max(peak, max(r["peak_bytes"] for r in rows))
if meas == float("inf"):
    print(f"| {L} | {n} | train failed | | | | |")
    sys.exit(0)
s = json.load(open(w + "/s.json"))["layouts"][0]
pred = s["step_time_s"]
print(f"| {L} | {n} | {pred*1e3:.1f} | {meas*1e3:.1f} | {100*(pred/meas-1):+.0f}% | "
      f"{s['memory_bytes_per_gpu']['total']/1e6:.1f} | {peak/1e6:.1f} |")
PY
}

# calibrate OUT BACKEND [launcher...]: the faster of two calibrations (GEMM peak x curve
# maximum).
calibrate() {
  local out=$1 backend=$2
  shift 2
  "$@" "$B" calibrate --backend "$backend" --out "$W/c1.json" >/dev/null 2>&1
  "$@" "$B" calibrate --backend "$backend" --out "$W/c2.json" >/dev/null 2>&1
  python3 - "$W/c1.json" "$W/c2.json" "$out" <<'PY'
import json, shutil, sys
a, b, out = sys.argv[1:4]
rate = lambda f: (lambda g: g["peak_flops_f32"] * g["gemm_eff_max"])(json.load(open(f))["gpu"])
shutil.copy(a if rate(a) >= rate(b) else b, out)
PY
}

HAVE_MPI=0
if command -v mpirun >/dev/null; then HAVE_MPI=1; fi
calibrate "$W/host.json" local
if [ $HAVE_MPI = 1 ]; then calibrate "$W/host-mpi.json" mpi mpirun -np 8 --oversubscribe; fi
# Rounds over all layouts, so that a burst of other work on the host hits one run of many
# layouts rather than every run of a few.
for round in $(seq "$RUNS"); do
  for L in "${LOCAL_LAYOUTS[@]}"; do measure local "$L" "$round"; done
  if [ $HAVE_MPI = 1 ]; then
    for L in "${MPI_LAYOUTS[@]}"; do measure mpi "$L" "$round"; done
  fi
done
echo "| backend, layout | ranks | predicted step (ms) | measured (ms) | error | predicted peak MB | measured peak MB |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for L in "${LOCAL_LAYOUTS[@]}"; do report local "$W/host.json" "$L"; done
if [ $HAVE_MPI = 1 ]; then
  for L in "${MPI_LAYOUTS[@]}"; do report mpi "$W/host-mpi.json" "$L"; done
fi
rm -rf "$W"
