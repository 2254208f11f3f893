#!/usr/bin/env bash
# Open MPI's launch agent for the hosts of scripts/hosts.sh (docs/multihost.md): used as
# `--mca plm_rsh_agent scripts/netns-agent.sh`, it is called like ssh, `AGENT [OPTIONS] HOST
# COMMAND...`, and runs COMMAND (Open MPI's daemon, orted) in the network namespace named HOST,
# in a UTS namespace of its own whose host name is HOST, so that the ranks there see the host
# name that the hostfile gives (MPI_Get_processor_name). No ssh daemon is needed. On real
# machines use ssh itself (Open MPI's default agent).
set -euo pipefail
while [ $# -gt 0 ] && [ "${1:0:1}" = - ]; do shift; done  # ssh-style options: none apply
[ $# -ge 2 ] || { echo "netns-agent.sh: usage: netns-agent.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
if ! ip netns list | grep -qw "^$host"; then
  echo "netns-agent.sh: no network namespace '$host' (make the hosts with scripts/hosts.sh up)" >&2
  exit 255
fi
# Like ssh, the words of COMMAND form one shell command line.
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
