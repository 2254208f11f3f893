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
# the job's own when it succeeds or fails with a usage error (2: restarting cannot help), or
# after MAX_RESTARTS restarts.
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
attempt=0
while true; do
  start=$(date +%s)
  "$@"
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 2 ]; then
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
