#!/usr/bin/env bash
# Elastic restart of an mpirun training job over a hostfile (docs/multihost.md):
#
#   scripts/elastic-mpirun.sh --hostfile F [--probe CMD] [--fence CMD] [--max-restarts R]
#       [--hang-grace S] [--log FILE] [--mpirun-opt OPT]... -- meshtrain train ... --tp T [--pp P]
#       --batch B --checkpoint-dir DIR --checkpoint-every N --resume auto [--metrics M]
#
# Starts the job on every host of F that answers, with dp = the largest that fits the hosts'
# slots (tp x pp fixed, dp dividing the global batch; --dp given is the most it may use).
# When the job fails (a host unreachable, a rank killed, a watchdog timeout) it finds the hosts
# that still answer, picks the largest dp that fits them (the global batch stays: each dp rank
# takes a larger share, in more microbatches when --microbatch is given), and starts the same
# command again with --resume auto: the newest valid checkpoint, resharded to the new layout
# by the trainer. The data order is a function of the global sample index, so the loss curve
# goes on as if nothing happened (within f32 rounding of the layout change).
#
# Each restart is one line on stderr ("elastic: restart K: ...") and, with --metrics M, one
# JSON record in M: {"event": "restart", "restart": K, "hosts": [...], "lost_hosts": [...],
# "layout": {"dp", "tp", "pp"}, "from_step": S, "steps_lost": L, "failed_after_s": ...}; the trainer
# keeps such records when it rewrites M on resume, and drops the step rows after S.
#
#   --probe CMD   a host answers when `CMD HOST` exits 0 within 5 s (default: ssh -o
#                 BatchMode=yes -o ConnectTimeout=5 HOST true; for scripts/hosts.sh hosts:
#                 "scripts/hosts.sh probe --prefix P")
#   --fence CMD   run as `CMD HOST` on a host found lost, before the restart (e.g.
#                 "scripts/hosts.sh kill --prefix P": its processes would never finish)
#   --hang-grace S  a job still running while one of its hosts has not answered for S
#                 seconds (default 30) is ended (mpirun can wait forever on a lost host's
#                 daemon); give at least the job's --comm-timeout
# Exit: the job's own code when it succeeds (0), is refused (2) or stopped on request (3);
# otherwise the last failure's after --max-restarts (default 3) restarts or when no layout
# fits the hosts left.
set -u
die() { echo "elastic-mpirun: $*" >&2; exit 2; }
hostfile="" probe="" fence="" max_restarts=3 grace=30 log=/dev/stderr
mpirun_opts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    --hostfile) hostfile=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
    --fence) fence=$2; shift 2 ;;
    --max-restarts) max_restarts=$2; shift 2 ;;
    --hang-grace) grace=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --mpirun-opt) mpirun_opts+=("$2"); shift 2 ;;
    *) die "unknown option '$1' (the job's command follows --)" ;;
  esac
done
[ "${1:-}" = -- ] || die "give the job's command after -- (meshtrain train ...)"
shift
[ -r "$hostfile" ] || die "--hostfile '$hostfile' cannot be read"
cmd=("$@")
# The layout flags of the command: tp, pp, batch, dp (the most dp may be), the metrics and the
# checkpoint folder. --dp is taken out: this script sets it.
tp=1 pp=1 batch="" dp_max="" metrics="" ckdir="" resume=""
job=()
i=0
while [ $i -lt ${#cmd[@]} ]; do
  a=${cmd[$i]} v=${cmd[$((i + 1))]:-}
  case "$a" in
    --tp) tp=$v ;;
    --pp) pp=$v ;;
    --batch) batch=$v ;;
    --metrics) metrics=$v ;;
    --checkpoint-dir) ckdir=$v ;;
    --resume) resume=$v ;;
    --dp) dp_max=$v; i=$((i + 2)); continue ;;
  esac
  job+=("$a")
  i=$((i + 1))
done
[ -n "$batch" ] || die "the command needs --batch (the global batch every layout keeps)"
[ -n "$ckdir" ] && [ "$resume" = auto ] ||
  die "the command needs --checkpoint-dir DIR and --resume auto (restarts go on from there)"

hosts=() slots=()
while read -r h rest; do
  [ -z "$h" ] || [ "${h:0:1}" = "#" ] && continue
  s=$(sed -n 's/.*slots=\([0-9]*\).*/\1/p' <<<"$rest")
  hosts+=("$h"); slots+=("${s:-1}")
done < "$hostfile"
[ ${#hosts[@]} -gt 0 ] || die "--hostfile '$hostfile' names no host"

answers() {  # HOST
  if [ -n "$probe" ]; then timeout 5 $probe "$1" >/dev/null 2>&1
  else timeout 5 ssh -o BatchMode=yes -o ConnectTimeout=5 "$1" true >/dev/null 2>&1; fi
}
latest_step() {  # the newest checkpoint's step (0: none)
  local s
  s=$(cat "$ckdir/latest" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p')
  echo "${s:-0}"
}
last_metrics_step() {
  [ -r "$metrics" ] || { echo 0; return; }
  local s
  s=$(grep -o '"step":[0-9]*' "$metrics" | tail -1 | cut -d: -f2)
  echo "${s:-0}"
}
json_list() { local s="" x; for x in "$@"; do s+="${s:+,}\"$x\""; done; echo "[$s]"; }

work=$(mktemp -d /tmp/elastic-mpirun.XXXXXX)
child=""
cleanup() {
  [ -n "$child" ] && kill -9 -- "-$child" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# SIGINT/SIGTERM stop the job cleanly instead of restarting it: mpirun passes SIGUSR1 on to
# every rank, which finishes its step, saves and exits 3 (docs/checkpoints.md).
stopping=""
on_signal() {
  stopping=1
  echo "elastic-mpirun: stopping the job (SIGUSR1 to mpirun; no restart)" >&2
  [ -n "$child" ] && kill -USR1 "$child" 2>/dev/null
}
trap on_signal INT TERM

attempt=0 lost_total=() ran_s=0
while true; do
  alive=() total=0 min_slots=0
  for k in "${!hosts[@]}"; do
    if answers "${hosts[$k]}"; then
      alive+=("${hosts[$k]}"); total=$((total + slots[k]))
      if [ $min_slots -eq 0 ] || [ "${slots[$k]}" -lt $min_slots ]; then min_slots=${slots[$k]}; fi
    fi
  done
  lost=()
  for h in "${hosts[@]}"; do [[ " ${alive[*]} " == *" $h "* ]] || lost+=("$h"); done
  for h in "${lost[@]}"; do
    [[ " ${lost_total[*]:-} " == *" $h "* ]] && continue
    lost_total+=("$h")
    [ -n "$fence" ] && $fence "$h" >/dev/null 2>&1
  done
  # The largest dp that fits: tp x pp x dp ranks on the hosts that answer, dp dividing the batch.
  per=$((tp * pp)) dp=0
  limit=$((total / per))
  [ -n "$dp_max" ] && [ "$dp_max" -lt $limit ] && limit=$dp_max
  for d in $(seq "$limit" -1 1); do
    if [ $((batch % d)) -eq 0 ]; then dp=$d; break; fi
  done
  if [ $dp -eq 0 ]; then
    echo "elastic-mpirun: no layout fits: ${#alive[@]} host(s) answer with $total slot(s), tp $tp x pp $pp needs $per" >&2
    exit 1
  fi
  [ -z "$dp_max" ] && dp_max=$dp  # never grow past the first layout
  np=$((dp * per))
  : > "$work/hostfile"
  for k in "${!hosts[@]}"; do
    [[ " ${alive[*]} " == *" ${hosts[$k]} "* ]] && echo "${hosts[$k]} slots=${slots[$k]}" >> "$work/hostfile"
  done
  if [ $attempt -gt 0 ]; then
    from=$(latest_step) done_step=$(last_metrics_step)
    lost_steps=$((done_step > from ? done_step - from : 0))
    echo "elastic: restart $attempt: lost host(s) ${lost[*]:-none}; ${#alive[@]} host(s) answer" \
         "(${alive[*]}); layout dp $dp x tp $tp x pp $pp, batch $batch; from checkpoint step" \
         "$from ($lost_steps step(s) trained again); the failed attempt ran ${ran_s} s" >> "$log"
    if [ -n "$metrics" ]; then
      printf '{"event":"restart","restart":%d,"hosts":%s,"lost_hosts":%s,"layout":{"dp":%d,"tp":%d,"pp":%d},"batch":%d,"from_step":%d,"steps_lost":%d,"failed_after_s":%s}\n' \
        "$attempt" "$(json_list "${alive[@]}")" "$(json_list "${lost[@]}")" "$dp" "$tp" "$pp" \
        "$batch" "$from" "$lost_steps" "$ran_s" >> "$metrics"
    fi
  fi
  start=$(date +%s.%N)
  setsid mpirun --hostfile "$work/hostfile" "${mpirun_opts[@]}" -np "$np" "${job[@]}" --dp "$dp" &
  child=$!
  # Wait for the job; end it when one of its hosts has been silent for --hang-grace seconds.
  silent_since=()
  while kill -0 "$child" 2>/dev/null && [ -z "$stopping" ]; do
    sleep 1
    now=$(date +%s)
    for k in "${!alive[@]}"; do
      if answers "${alive[$k]}"; then silent_since[$k]=""
      else
        [ -z "${silent_since[$k]:-}" ] && silent_since[$k]=$now
        if [ $((now - silent_since[k])) -ge "$grace" ]; then
          echo "elastic-mpirun: host ${alive[$k]} silent for ${grace} s: ending the job" >&2
          kill -9 -- "-$child" 2>/dev/null
        fi
      fi
    done
  done
  wait "$child"
  rc=$?
  child=""
  if [ -n "$stopping" ]; then exit $rc; fi
  ran_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc -eq 0 ] || [ $rc -eq 2 ] || [ $rc -eq 3 ]; then exit $rc; fi
  echo "elastic-mpirun: the job exited with $rc after $ran_s s" >&2
  if [ $attempt -ge "$max_restarts" ]; then
    echo "elastic-mpirun: $max_restarts restart(s) used; giving up" >&2
    exit $rc
  fi
  attempt=$((attempt + 1))
done
