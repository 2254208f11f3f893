#!/usr/bin/env python3
"""A fixed one-way delay for the hosts of scripts/hosts.sh where the kernel has no netem.

`hosts.sh shape --delay D` on a kernel without the netem qdisc (sch_netem) starts this
program once for all hosts. For each host it makes a TUN device `P-dI` (with a virtio net
header, so large GSO packets pass whole) and moves it into the host's namespace; hosts.sh
then redirects every IPv4 packet that arrives on the host's link (tc ingress, u32 match all,
mirred redirect) to that device. This program reads each packet, holds it for D, and writes
it back into the same TUN device, where the kernel receives it as if it had just arrived:
every packet into a host is D late, so the round trip between two hosts is 2 D (one D each
way). ARP and the host's own sends are not touched. A constant delay keeps the packets'
order. The program runs in the machine's own namespace, so `hosts.sh kill H` (which kills
the processes inside host H) leaves the delay line alone; `hosts.sh down` and
`hosts.sh shape --rate off` stop it.

  netdelay.py --delay-us D --tun NAME:NETNS [--tun NAME:NETNS ...]

It prints "ready" on stdout once every device is in its namespace and up.
Python's standard library only (Linux).
"""
import argparse
import collections
import fcntl
import os
import select
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
READ_SIZE = 65536 + 64  # a whole GSO packet plus the virtio header


def fail(message):
    print("netdelay.py: " + message, file=sys.stderr)
    sys.exit(2)


def make_tun(name, netns):
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI | IFF_VNET_HDR))
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    except OSError as e:
        fail(f"cannot make TUN device '{name}' ({e}; needs /dev/net/tun and CAP_NET_ADMIN)")
    for cmd in (["ip", "link", "set", name, "netns", netns],
                ["ip", "-n", netns, "link", "set", name, "txqueuelen", "10000", "up"],
                # Packets come back on this device though their source is reached through the
                # host's link: reverse-path filtering must not drop them.
                ["ip", "netns", "exec", netns, "sysctl", "-qw", f"net.ipv4.conf.{name}.rp_filter=0",
                 "net.ipv4.conf.all.rp_filter=0"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"'{' '.join(cmd)}' failed: {r.stderr.strip()}")
    return fd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delay-us", type=int, required=True, help="one-way delay in microseconds")
    ap.add_argument("--tun", action="append", required=True, help="NAME:NETNS, once per host")
    args = ap.parse_args()
    if args.delay_us < 0 or args.delay_us > 10_000_000:
        fail(f"--delay-us {args.delay_us} is out of range (0 to 10 s)")
    delay = args.delay_us / 1e6  # seconds
    fds = []
    for spec in args.tun:
        name, sep, netns = spec.partition(":")
        if not sep or not name or not netns:
            fail(f"--tun '{spec}' must be NAME:NETNS")
        fds.append(make_tun(name, netns))
    print("ready", flush=True)
    # One FIFO of (due time, packet) per device: the delay is the same for all packets, so
    # each FIFO is in due order and only its head needs to be watched.
    queues = {fd: collections.deque() for fd in fds}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    while True:
        now = time.monotonic()
        due = min((q[0][0] for q in queues.values() if q), default=None)
        timeout_ms = None if due is None else max(0.0, (due - now) * 1000.0)
        for fd, events in poller.poll(timeout_ms):
            if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                fail("a TUN device went away (its namespace was removed)")
            arrived = time.monotonic() + delay
            q = queues[fd]
            for _ in range(256):  # drain what is there, then look at the clock again
                try:
                    packet = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    break
                q.append((arrived, packet))
        now = time.monotonic()
        for fd, q in queues.items():
            while q and q[0][0] <= now:
                try:
                    os.write(fd, q.popleft()[1])
                except BlockingIOError:
                    break  # the kernel's backlog is full: the packet is lost, as on a link
                except OSError:
                    pass  # e.g. the host's link is down: dropped, as the link would


if __name__ == "__main__":
    main()
