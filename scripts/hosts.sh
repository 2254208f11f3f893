#!/usr/bin/env bash
# Several hosts on this one machine: Linux network namespaces on a private bridge, reached by
# Open MPI through scripts/netns-agent.sh instead of ssh (docs/multihost.md).
#
#   scripts/hosts.sh up N [--prefix P] [--slots S]   N hosts P-h0 .. P-h(N-1), S slots each
#   scripts/hosts.sh down [--prefix P]               remove them (and everything they run)
#   scripts/hosts.sh shape [--rate R] [--delay D] [--prefix P]  e.g. --rate 1gbit --delay 1ms:
#                                                    R each way on every host link (tbf), every
#                                                    packet into a host D late (netdelay.py);
#                                                    --rate off removes both
#   scripts/hosts.sh hostfile [--prefix P]           print the path of the hostfile
#   scripts/hosts.sh mpirun-args [--no-hostfile] [--prefix P]   mpirun's options for these hosts
#   scripts/hosts.sh probe H [--prefix P]            exit 0 when host H answers (link up)
#   scripts/hosts.sh cut H | heal H [--prefix P]     take host H's link down / up again
#   scripts/hosts.sh kill H [--prefix P]             SIGKILL every process of host H
#   scripts/hosts.sh list [--prefix P]               host name, address, link state
#   scripts/hosts.sh rtt A B [--prefix P]            round trip A -> B in ms: min and median of 5
#
# Each host is a namespace `P-hI` with loopback up and one interface (a veth pair whose other
# end is on the bridge `P-br`), its address 10.A.B.(10+I)/24 on a subnet chosen from the prefix
# and checked against this machine's routes; the bridge holds 10.A.B.1, where mpirun (in the
# machine's own namespace) listens. Nothing leaves the subnet: no route, no NAT, no forwarding.
# Distinct prefixes never collide, so parallel test runs each make their own hosts. State lives
# in /run/meshtrain-hosts/P (or $MT_HOSTS_STATE/P). Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN).
set -euo pipefail

die() { echo "hosts.sh: $*" >&2; exit 2; }
cmd=${1:-}
[ -n "$cmd" ] || die "usage: hosts.sh up N | down | shape [--rate R] [--delay D] | hostfile | mpirun-args | probe H | cut H | heal H | kill H | list  [--prefix P]"
shift
n="" prefix=mt rate="" delay="" slots=2 host="" host2="" with_hostfile=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --no-hostfile) with_hostfile=0; shift ;;
    -*) die "unknown option '$1'" ;;
    *) if [ "$cmd" = up ] && [ -z "$n" ]; then n=$1
       elif [ -z "$host" ]; then host=$1; else host2=$1; fi; shift ;;
  esac
done
# Interface names have at most 15 characters: P-br, P-vI (root end), P-hI (namespace).
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
  die "--prefix '$prefix' must be 1-8 lower-case letters or digits, starting with a letter"
state=${MT_HOSTS_STATE:-/run/meshtrain-hosts}/$prefix
bridge=$prefix-br

ns_of() { echo "$prefix-h$1"; }
index_of() {  # a host name or index -> its index, checked
  local h=$1 i
  i=${h#"$prefix"-h}
  [[ "$i" =~ ^[0-9]+$ ]] && [ -e "$state/n" ] && [ "$i" -lt "$(cat "$state/n")" ] ||
    die "host '$h' is not one of prefix '$prefix' (see: hosts.sh list --prefix $prefix)"
  echo "$i"
}

pick_subnet() {  # 10.A.B.0/24 from a hash of the prefix, the first one no route uses
  local h a b k used
  h=$(printf '%s' "$prefix" | cksum | cut -d' ' -f1)
  used=$(ip -4 route show; ip -4 addr show)
  for k in $(seq 0 63); do
    a=$(( 200 + (h / 256 + k) % 50 )); b=$(( (h + k * 37) % 256 ))
    if ! grep -q "10\.$a\.$b\." <<<"$used"; then echo "10.$a.$b"; return; fi
  done
  die "no free 10.x.y.0/24 subnet found for prefix '$prefix'"
}

do_down() {
  local i ns pid
  stop_delay
  if [ -e "$state/n" ]; then
    for i in $(seq 0 $(( $(cat "$state/n") - 1 ))); do
      ns=$(ns_of "$i")
      if ip netns list | grep -qw "^$ns"; then
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
      fi
      ip link del "$prefix-v$i" 2>/dev/null || true
    done
  fi
  # Leftovers of a run whose state was lost: every namespace and link of this prefix.
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-h[0-9]*$" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$state"
}

do_up() {
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] ||
    die "up needs a host count from 1 to 200, got '$n'"
  [[ "$slots" =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] || die "--slots must be a positive count"
  [ -e "$state/n" ] && die "hosts of prefix '$prefix' exist; run 'hosts.sh down --prefix $prefix' first"
  command -v ip >/dev/null || die "the 'ip' command (iproute2) is missing"
  local probe="$prefix-probe" net i ns
  ip netns add "$probe" 2>/dev/null ||
    die "cannot create a network namespace here ('ip netns add' refused: needs root and CAP_SYS_ADMIN, e.g. not inside an unprivileged container)"
  ip netns del "$probe"
  mkdir -p "$state"
  trap 'do_down; exit 1' ERR
  net=$(pick_subnet)
  echo "$net" > "$state/subnet"
  ip link add "$bridge" type bridge
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  : > "$state/hostfile"
  for i in $(seq 0 $((n - 1))); do
    ns=$(ns_of "$i")
    ip netns add "$ns"
    ip link add "$prefix-v$i" type veth peer name "$ns" netns "$ns"
    ip link set "$prefix-v$i" master "$bridge" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$net.$((10 + i))/24" dev "$ns"
    ip -n "$ns" link set "$ns" up
    echo "$ns slots=$slots" >> "$state/hostfile"
  done
  echo "$n" > "$state/n"
  trap - ERR
  echo "hosts.sh: $n host(s) $(ns_of 0)..$(ns_of $((n - 1))) on $net.0/24 (bridge $bridge, $net.1); hostfile $state/hostfile" >&2
}

delay_us() {  # D (e.g. 10ms, 500us, 0.5ms, 1s) -> whole microseconds, checked
  [[ "$1" =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] ||
    die "--delay '$1' must be a number with a unit us, ms or s (e.g. 10ms)"
  awk -v v="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
    'BEGIN { m = (u == "s") ? 1e6 : (u == "ms") ? 1e3 : 1; printf "%d\n", v * m + 0.5 }'
}

stop_delay() {  # the delay line of a previous `shape --delay`, if any
  local pid
  if [ -e "$state/netdelay.pid" ]; then
    pid=$(cat "$state/netdelay.pid")
    # Only our own process: the pid file's process must still be netdelay.py.
    if grep -q netdelay.py "/proc/$pid/cmdline" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      # Its devices go when it exits; wait, so that new ones of the same names can be made.
      for _ in $(seq 1 50); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
    fi
    rm -f "$state/netdelay.pid"
  fi
}

start_delay() {  # every packet into a host held for $1 us (scripts/netdelay.py)
  local us=$1 i ns args=() pid t
  command -v python3 >/dev/null || die "--delay needs python3 (scripts/netdelay.py)"
  for i in $(seq 0 $(( $(cat "$state/n") - 1 ))); do args+=(--tun "$prefix-d$i:$(ns_of "$i")"); done
  setsid python3 "$(cd "$(dirname "$0")" && pwd)/netdelay.py" --delay-us "$us" "${args[@]}" \
    > "$state/netdelay.out" 2> "$state/netdelay.log" < /dev/null &
  pid=$!
  echo "$pid" > "$state/netdelay.pid"
  for t in $(seq 1 100); do  # it says "ready" once its devices are in place (10 s at most)
    grep -q ready "$state/netdelay.out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || die "the delay line did not start: $(cat "$state/netdelay.log")"
    sleep 0.1
  done
  grep -q ready "$state/netdelay.out" || { stop_delay; die "the delay line did not start within 10 s"; }
  for i in $(seq 0 $(( $(cat "$state/n") - 1 ))); do
    ns=$(ns_of "$i")
    # Every IPv4 packet arriving on the host's link goes through its delay device first.
    tc -n "$ns" qdisc add dev "$ns" ingress
    tc -n "$ns" filter add dev "$ns" parent ffff: protocol ip prio 1 u32 match u32 0 0 \
      action mirred egress redirect dev "$prefix-d$i"
  done
}

shape_one() {  # DEV [-n NS]: the rate on one end of a host link
  local dev=$1; shift
  tc "$@" qdisc del dev "$dev" root 2>/dev/null || true
  [ -n "$rate" ] && [ "$rate" != off ] || return 0
  # tbf: a 256 KiB bucket (above rate x 1 ms up to 2 Gbit/s), packets queue up to 50 ms
  tc "$@" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms ||
    die "tc refused --rate '$rate' (use e.g. 1gbit, 100mbit)"
}

do_shape() {
  [ -n "$rate" ] || [ -n "$delay" ] ||
    die "shape needs --rate R and/or --delay D (e.g. --rate 1gbit --delay 10ms; '--rate off' removes both)"
  [ -e "$state/n" ] || die "no hosts of prefix '$prefix' (run 'hosts.sh up N --prefix $prefix')"
  [ "$rate" = off ] && [ -n "$delay" ] && die "--rate off removes the shaping; give no --delay with it"
  local i us=""
  [ -n "$delay" ] && us=$(delay_us "$delay")
  stop_delay
  for i in $(seq 0 $(( $(cat "$state/n") - 1 ))); do
    # Both ends of each host's link: the bridge end (traffic towards the host) and the
    # namespace end (traffic from it), so a transfer between two hosts crosses two shapers.
    shape_one "$prefix-v$i"
    shape_one "$(ns_of "$i")" -n "$(ns_of "$i")"
    tc -n "$(ns_of "$i")" qdisc del dev "$(ns_of "$i")" ingress 2>/dev/null || true
  done
  # The delay: this kernel family often lacks the netem qdisc (CONFIG_NET_SCH_NETEM), so it
  # is a delay line of our own (scripts/netdelay.py) that holds each packet into a host.
  [ -n "$us" ] && [ "$us" -gt 0 ] && start_delay "$us"
  if [ "$rate" = off ]; then echo "hosts.sh: links of prefix '$prefix' no longer shaped" >&2
  else echo "hosts.sh: links of prefix '$prefix' shaped:${rate:+ rate $rate each way}${delay:+ delay $delay one way (round trip 2 x $delay)}" >&2; fi
}

case "$cmd" in
  up) do_up ;;
  down) do_down ;;
  shape) do_shape ;;
  hostfile) [ -e "$state/hostfile" ] || die "no hosts of prefix '$prefix'"; echo "$state/hostfile" ;;
  mpirun-args)
    [ -e "$state/subnet" ] || die "no hosts of prefix '$prefix'"
    # Every namespace host shares this machine's cores, which Open MPI cannot see: without
    # mpi_yield_when_idle a rank waiting in a collective spins through its whole time slice
    # while the rank it waits for is off the core (tiny dp 2 x tp 2 on 2 hosts: 2.6 ms per
    # tp all-reduce inside a host, 88-376 ms a step; with it 0.5 ms and 52-76 ms).
    agent=$(cd "$(dirname "$0")" && pwd)/netns-agent.sh
    [ $with_hostfile = 1 ] && printf -- '--hostfile %s ' "$state/hostfile"
    echo "--mca plm_rsh_agent $agent" \
         "--mca btl tcp,self,vader --mca btl_tcp_if_include $(cat "$state/subnet").0/24" \
         "--mca oob_tcp_if_include $(cat "$state/subnet").0/24" \
         "--mca mpi_yield_when_idle 1" ;;
  probe)  # exit 0 when host H answers: its namespace is there and its link is up
    i=$(index_of "$host")
    ip netns list | grep -qw "^$(ns_of "$i")" &&
      [ "$(cat "/sys/class/net/$prefix-v$i/operstate" 2>/dev/null)" = up ] ;;
  cut) ip link set "$prefix-v$(index_of "$host")" down ;;
  heal) ip link set "$prefix-v$(index_of "$host")" up ;;
  kill)
    i=$(index_of "$host")
    for pid in $(ip netns pids "$(ns_of "$i")"); do kill -9 "$pid" 2>/dev/null || true; done ;;
  list)
    [ -e "$state/n" ] || die "no hosts of prefix '$prefix'"
    for i in $(seq 0 $(( $(cat "$state/n") - 1 ))); do
      echo "$(ns_of "$i") $(cat "$state/subnet").$((10 + i)) $(cat "/sys/class/net/$prefix-v$i/operstate")"
    done ;;
  rtt)  # TCP connects from host A to a listener on host B: the time to the SYN-ACK
    i=$(index_of "$host")
    [ -n "$host2" ] || die "rtt needs two hosts: rtt A B"
    j=$(index_of "$host2")
    command -v python3 >/dev/null || die "rtt needs python3"
    python3 - "$(ns_of "$i")" "$(ns_of "$j")" "$(cat "$state/subnet").$((10 + j))" <<'PY'
import ctypes, os, socket, statistics, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def enter(ns):  # a socket belongs to the namespace its process is in when it is made
    fd = os.open("/run/netns/" + ns, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        sys.exit(f"hosts.sh rtt: cannot enter namespace {ns}: {os.strerror(ctypes.get_errno())}")
    os.close(fd)
a, b, addr = sys.argv[1:4]
enter(b)
listener = socket.socket()
listener.bind((addr, 0))
listener.listen(16)
port = listener.getsockname()[1]
enter(a)
times = []
for _ in range(5):
    t = time.monotonic()
    c = socket.create_connection((addr, port), timeout=10)
    times.append((time.monotonic() - t) * 1e3)
    c.close()
print(f"{min(times):.3f} {statistics.median(times):.3f}")
PY
    ;;
  *) die "unknown command '$cmd'" ;;
esac
