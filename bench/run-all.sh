#!/usr/bin/env bash
# `make bench`: every benchmark in bench/, each side by side with its peer in one run, then
# BENCH.md from their result files (bench/collect). Scripts that print their tables run
# under bench/record (REPS repetitions, default 3: every repetition, medians with min-max,
# command, commit, CPU, load before and after, a busy run marked); the others write their
# own result files with their own repetitions and medians (vs-pytorch-llama, comm, plan,
# attention, cp), which bench/record --own stamps with the same facts.
# Run it on a quiet machine, at top priority in its own autogroup (BENCH.md's protocol):
#   setsid bash -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 bench/run-all.sh'
# usage: bench/run-all.sh [BUILD_DIR]     env: REPS=3; ONLY="dp tp" runs only those
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
build=$(cd "$build" && pwd)
MT=$build/meshtrain
REPS=${REPS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The scripts that wait for /tmp/meshtrain-bench-quiet to go (quality benchmarks) do not
# wait inside make bench: its operator holds the lock for it.
export MESHTRAIN_IN_MAKE_BENCH=1
[ -x "$MT" ] || { echo "run-all: no $MT (make build first)" >&2; exit 2; }
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
failed=()
run() { echo "== $*" >&2; "$@"; }
rec() {  # rec NAME [ENV=VALUE...] -- COMMAND...: bench/record NAME over REPS repetitions
  local name=$1
  shift
  want "$name" || return 0
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  # A benchmark that fails is reported at the end; the others still run.
  run env "${envs[@]}" "$root/bench/record" "$name" --reps "$REPS" -- "$@" || failed+=("$name")
}
own() {  # own NAME COMMAND...: a script that writes its own result file (and repeats inside);
  local name=$1  # bench/record --own stamps it with the command, commit, CPU and load
  shift
  want "$name" || return 0
  run "$root/bench/record" "$name" --own -- "$@" || failed+=("$name")
}

run "$MT" bench peak
# Each script's own best-of rounds set to 1 (REPEAT=1, pp's REPS=1): bench/record repeats.
rec gemm -- "$root/bench/gemm-vs-openblas" "$MT"
rec vs-pytorch -- "$root/bench/vs-pytorch" "$MT"
own vs-pytorch-llama env REPS="$REPS" "$root/bench/vs-pytorch-llama" "$MT"
own comm "$root/bench/comm" "$MT"
rec dp -- "$root/bench/dp" "$build"
rec tp REPEAT=1 -- "$root/bench/tp" "$build"
rec pp REPS=1 -- "$root/bench/pp" "$build"
rec mixed-precision REPEAT=1 -- "$root/bench/mixed-precision" "$build"
rec mixed-linear -- "$build/mixed_linear_bench"
rec mfu-ceiling -- "$root/bench/mfu-ceiling" "$build"
rec checkpoint REPEAT=1 -- "$root/bench/checkpoint" "$build"
own attention "$root/bench/attention" "$build"
own cp "$root/bench/cp" "$build"
own plan "$root/bench/plan" "$build"
rec plan-vs-runtime -- "$root/bench/plan-vs-runtime" "$build"
own moe-balance "$root/bench/moe-balance" "$MT"
# Expert parallelism's two benchmarks take at least 5 repetitions (issue 25).
REPS=$((REPS < 5 ? 5 : REPS)) rec moe-ep -- "$root/bench/moe-ep" "$build"
REPS=$((REPS < 5 ? 5 : REPS)) rec moe-a2a -- "$root/bench/moe-a2a" "$MT"
own diloco "$root/bench/diloco/quality" "$MT"
WARMUP=150 own diloco-warmup "$root/bench/diloco/quality" "$MT"
CORPUS=docs BATCH=64 STEPS=1200 WARMUP=300 WARMUP_AT=one-site OUT=diloco-docs \
  RUNS="sync diloco streaming diloco_int8" own diloco-docs "$root/bench/diloco/quality" "$MT"
own diloco-link "$root/bench/diloco/link" "$MT"
own long_context "$root/bench/long-context" "$build"
if [ "$(id -u)" = 0 ]; then own multihost "$root/bench/multihost" "$build"; fi  # netns: root
run "$root/bench/collect"
echo "results: $root/bench/results/; BENCH.md rebuilt" >&2
if [ ${#failed[@]} -gt 0 ]; then
  echo "run-all: FAILED (their old result files, if any, are unchanged): ${failed[*]}" >&2
  exit 1
fi
