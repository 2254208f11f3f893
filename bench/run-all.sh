#!/usr/bin/env bash
# `make bench`: every benchmark, each side by side with its peer in one run. Each script
# writes its table to bench/results/*.md; BENCH.md collects them with the commands.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
MT=$build/meshtrain
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { echo "== $*" >&2; "$@"; }
run "$MT" bench peak
[ -x "$root/bench/gemm-vs-openblas" ] && run "$root/bench/gemm-vs-openblas" "$MT"
run "$root/bench/vs-pytorch" "$MT"
run "$root/bench/vs-pytorch-llama" "$MT"
[ -x "$root/bench/comm" ] && run "$root/bench/comm" "$MT"
[ -x "$root/bench/dp" ] && run "$root/bench/dp" "$MT"
run "$root/bench/plan" "$build"
echo "results: $root/bench/results/" >&2
