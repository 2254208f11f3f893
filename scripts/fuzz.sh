#!/usr/bin/env bash
# Builds and runs the libFuzzer harness of one reader of outside files (docs/fuzzing.md):
#
#   scripts/fuzz.sh READER SECONDS [LIBFUZZER_FLAG...]   one harness (tests/fuzz/READER_fuzz.cpp)
#   scripts/fuzz.sh all SECONDS                         every harness in turn, SECONDS each
#   scripts/fuzz.sh list                                the harnesses
#   scripts/fuzz.sh seeds                               remake tests/fuzz/corpus (make_seeds.py)
#
# The build tree is build/fuzz (clang, ASan + UBSan, -O1; FUZZ_BUILD overrides). The fuzzer
# grows build/fuzz/corpus/READER from the seeds in tests/fuzz/corpus/READER; a crash, a
# sanitizer report, an allocation over 512 MiB, 2 GiB of RSS or an input taking over 10 s
# stops it and leaves the input in build/fuzz/artifacts/READER/. Prints a summary line per
# harness: executions, executions per second, coverage (libFuzzer's cov: edges and ft:
# features). Exit status 1 when a harness found something.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${FUZZ_BUILD:-build/fuzz}
JOBS=${JOBS:-$(nproc)}

harnesses() {
  for f in tests/fuzz/*_fuzz.cpp; do
    basename "$f" _fuzz.cpp
  done
}

usage() {
  echo "usage: scripts/fuzz.sh READER SECONDS [LIBFUZZER_FLAG...] | all SECONDS | list | seeds" >&2
  echo "readers: $(harnesses | tr '\n' ' ')" >&2
  exit 2
}

configure() {
  scripts/setup.sh fuzz
  if [ ! -f "$BUILD/build.ninja" ]; then
    nice -n 10 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DCMAKE_CXX_COMPILER=clang++ -DMESHTRAIN_CUDA=OFF \
      -DMESHTRAIN_FUZZ=ON >/dev/null
  fi
}

build() {  # targets...
  nice -n 10 cmake --build "$BUILD" -j "$JOBS" --target "$@"
}

# Runs one harness for $2 seconds; prints its summary line; returns 1 if it found something.
run_one() {
  local reader=$1 seconds=$2
  shift 2
  local corpus="$BUILD/corpus/$reader" artifacts="$BUILD/artifacts/$reader/"
  local log="$BUILD/logs/$reader.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  local status=0
  # halt_on_error: the first report stops the run (and libFuzzer keeps the input).
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=${ASAN_OPTIONS:-} \
    nice -n 15 "$BUILD/tests/fuzz/fuzz_$reader" "$corpus" "tests/fuzz/corpus/$reader" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 \
    -max_len=8192 -artifact_prefix="$artifacts" -print_final_stats=1 "$@" >"$log" 2>&1 ||
    status=$?
  # The last status line ("#N DONE cov: X ft: Y corp: ...", or the last pulse before a crash).
  local last execs rate cov ft corp
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -1)
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" | tail -1)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$last")
  if [ "$status" -eq 0 ]; then
    printf '%-17s %5ss  %10s execs  %6s execs/s  cov %5s  ft %6s  corpus %s  OK\n' "$reader" \
      "$seconds" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}"
    return 0
  fi
  printf '%-17s FOUND A BUG (exit %s) after %s execs; the log: %s\n' "$reader" "$status" \
    "${execs:-?}" "$log"
  grep -E '^==[0-9]+==ERROR|^SUMMARY|runtime error|terminate called|what\(\)|^artifact_prefix|Test unit written' \
    "$log" | head -12 || true
  return 1
}

[ $# -ge 1 ] || usage
case "$1" in
  list)
    harnesses
    ;;
  seeds)
    configure
    build fuzz_checkpoint_index
    # One run of the harness on an empty input writes its checkpoint and copies the index.
    index=$(mktemp --suffix=.json) empty=$(mktemp)
    MESHTRAIN_FUZZ_SEED_OUT="$index" "$BUILD/tests/fuzz/fuzz_checkpoint_index" "$empty" \
      >/dev/null 2>&1
    tests/fuzz/make_seeds.py "$index"
    rm -f "$index" "$empty"
    ;;
  all)
    [ $# -eq 2 ] || usage
    configure
    mapfile -t all < <(harnesses)
    build "${all[@]/#/fuzz_}"
    failed=0
    for r in "${all[@]}"; do run_one "$r" "$2" || failed=1; done
    exit $failed
    ;;
  *)
    [ $# -ge 2 ] || usage
    [ -f "tests/fuzz/$1_fuzz.cpp" ] || usage
    reader=$1 seconds=$2
    shift 2
    configure
    build "fuzz_$reader"
    run_one "$reader" "$seconds" "$@"
    ;;
esac
