#!/usr/bin/env bash
# Writes bench/results/gpu.md from the device runs saved under bench/results/gpu/<run>/
# (what `scripts/device-run.sh bench` / `check verify` wrote to $OUT, copied as it came
# back, plus what.txt: the command of the call). Each bench run's own fragment (bench.md,
# written by bench/gpu/run.sh) follows its command and the spread of its step times
# (report.py spread); each verify run's summary table follows its command. Nothing is typed.
#
# usage: bench/gpu/collect.sh RUN...   (folder names under bench/results/gpu, in page order)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$root/bench/results/gpu
out=$root/bench/results/gpu.md
[ $# -ge 1 ] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
{
  echo "# GPU: meshtrain \`--device cuda\` vs PyTorch (bench/gpu), and verify on the GPU"
  echo
  echo "Each section is one call of the device tool (docs/cuda-device-session.md); the raw files"
  echo "are in bench/results/gpu/<run>/. Written by \`bench/gpu/collect.sh $*\`."
  for run in "$@"; do
    d=$dir/$run
    [ -d "$d" ] || { echo "collect: no run $d" >&2; exit 1; }
    echo
    echo "## $run"
    echo
    echo "Call: \`$(cat "$d/what.txt")\`"
    echo
    if [ -f "$d/bench.md" ]; then
      sed 's/^## /#### /' "$d/bench.md"
      echo
      # (bench.md fragments written since 2026-11-27 list the step times themselves)
      if ! grep -q "ms median" "$d/bench.md"; then
        echo "Step times and memory:"
        echo
        python3 "$root/bench/gpu/report.py" spread "$d/bench.jsonl"
      fi
    else
      echo '```'
      cat "$d/summary.txt"
      echo '```'
    fi
  done
} >"$out"
echo "wrote $out" >&2
