#!/usr/bin/env bash
# Restarts a training job from its newest checkpoint when it fails (docs/checkpoints.md):
#
#   scripts/supervise-mpirun.sh MAX_RESTARTS mpirun -np 8 meshtrain train ... \
#       --checkpoint-dir DIR --checkpoint-every N --resume auto
#
# The command must carry `--resume auto`, so that the same command line serves the first
# start (no checkpoint yet: from scratch) and every restart (the newest valid checkpoint).
# A dead or hung rank ends the mpirun job promptly with a non-zero exit (SIGKILL of a rank:
# mpirun ends the others; a hang: the watchdog's --comm-timeout, MPI_Abort). Exit codes:
# the job's own when it succeeds (0), fails with a usage error (2: restarting cannot help) or
# was stopped on request (3: a signal; its checkpoint is saved), or after MAX_RESTARTS
# restarts.
#
# SIGINT (Ctrl-C) or SIGTERM to the supervisor stops it instead of restarting: the signal is
# forwarded to the job — to mpirun as SIGUSR1, which Open MPI passes on to every rank as it is
# (mpirun's own SIGINT/SIGTERM handling kills the ranks after 1 s, before they could save),
# to any other command as SIGTERM — so that every rank finishes its step, saves a checkpoint
# and exits 3; the supervisor then exits with the job's code. A second signal is forwarded
# again, which makes the job stop at once.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 MAX_RESTARTS COMMAND..." >&2
  exit 2
fi
max=$1
shift
case " $* " in
  *" --resume auto "*) ;;
  *) echo "supervise-mpirun: the command needs --resume auto (it restarts from the newest checkpoint)" >&2
     exit 2 ;;
esac
case "$(basename "$1")" in
  mpirun|mpiexec|orterun) forward_as=USR1 ;;
  *) forward_as=TERM ;;  # (a job started with & from a script ignores SIGINT)
esac
stopping=""
child=""
on_signal() {
  if [ -z "$stopping" ]; then
    stopping=$1
    echo "supervise-mpirun: SIG$1: stopping the job (SIG$forward_as to it; no restart; send" \
         "the signal again to stop it at once)" >&2
  fi
  if [ -n "$child" ]; then kill -s "$forward_as" "$child" 2>/dev/null; fi
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
attempt=0
while true; do
  start=$(date +%s)
  # In the background, so that a signal runs the trap at once (a foreground command would
  # delay it until the command ends); wait returns early (above 128) when a trap ran.
  "$@" &
  child=$!
  if [ -n "$stopping" ]; then kill -s "$forward_as" "$child" 2>/dev/null; fi  # a signal just now
  while true; do
    wait "$child"
    rc=$?
    if [ $rc -le 128 ] || ! kill -0 "$child" 2>/dev/null; then break; fi
  done
  if [ $rc -gt 128 ]; then  # maybe the trap's interruption: the job's own status, if any
    wait "$child" 2>/dev/null
    real=$?
    if [ $real -ne 127 ]; then rc=$real; fi
  fi
  child=""
  if [ -n "$stopping" ]; then
    echo "supervise-mpirun: the job exited with $rc after SIG$stopping; not restarting" >&2
    exit $rc
  fi
  if [ $rc -eq 0 ] || [ $rc -eq 2 ] || [ $rc -eq 3 ]; then
    exit $rc
  fi
  echo "supervise-mpirun: the job exited with $rc after $(( $(date +%s) - start )) s" >&2
  if [ $attempt -ge "$max" ]; then
    echo "supervise-mpirun: $max restart(s) used; giving up" >&2
    exit $rc
  fi
  attempt=$((attempt + 1))
  echo "supervise-mpirun: restart $attempt of $max from the newest checkpoint" >&2
done
