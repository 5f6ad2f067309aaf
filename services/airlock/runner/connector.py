"""The kernel's process-events connector: its wire constants and the subscription (runner/proctree.py reads it).

`subscribe` returns a non-blocking netlink socket the kernel has acknowledged
as a listener, or raises `Unavailable` with the reason.  The kernel answers a
listener it accepts with an event of type NONE; one in another PID or user
namespace (a container) it ignores without a word, so the wait for that
answer is bounded (``ACK_SECONDS``).  The kernel's test is the caller's
namespaces (drivers/connector/cn_proc.c, ``cn_proc_mcast_ctl``): the same test
is made first here, on the inode numbers the kernel gives its initial PID and
user namespaces, so a runner in a container learns at once, not after the
wait (which every cold start of the runner there used to pay).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

from airlock.runner.taskstats import ACK_SECONDS as ACK_SECONDS  # the bound on the answer
from airlock.runner.taskstats import NLMSG, RCVBUF

# include/linux/proc_ns.h: PROC_PID_INIT_INO and PROC_USER_INIT_INO, the initial namespaces' inodes.
_INITIAL_NAMESPACES = {"pid": 0xEFFFFFFC, "user": 0xEFFFFFFD}

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3
EV_NONE, EV_FORK, EV_EXEC, EV_EXIT = 0x0, 0x1, 0x2, 0x80000000
CNMSG = struct.Struct("=IIIIHH")
EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp_ns (CLOCK_MONOTONIC)
DATA_AT = NLMSG.size + CNMSG.size + EVENT.size


_SILENT = (
    "the kernel's process-events connector did not answer (it serves only the initial PID "
    "and user namespaces: is the runner in a container?)"
)


class Unavailable(Exception):
    """No process events from the connector here; the message says why."""


def in_initial_namespaces() -> bool:
    """Whether this process is in the initial PID and user namespaces (the only ones the connector serves)."""
    try:
        return all(os.stat(f"/proc/self/ns/{ns}").st_ino == ino for ns, ino in _INITIAL_NAMESPACES.items())
    except OSError:
        return True  # cannot tell: let the kernel's answer (or its silence) say


def subscribe() -> socket.socket:
    """A listener the kernel acknowledged (non-blocking), or `Unavailable`."""
    if not in_initial_namespaces():
        raise Unavailable(
            "the kernel's process-events connector serves only the initial PID and user namespaces, "
            "and the runner is in another (a container?)"
        )
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
    except OSError as exc:
        raise Unavailable(f"no process-events connector: {exc.strerror or exc}") from None
    try:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root)
        sock.bind((0, CN_IDX_PROC))
        body = CNMSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, 4, 0) + struct.pack("=I", PROC_CN_MCAST_LISTEN)
        sock.send(NLMSG.pack(NLMSG.size + len(body), NLMSG_DONE, 0, 0, 0) + body)
        sock.settimeout(ACK_SECONDS)
        give_up = time.monotonic() + ACK_SECONDS
        acked = False
        while not acked and time.monotonic() < give_up:
            data = sock.recv(65536)
            acked = len(data) >= DATA_AT and EVENT.unpack_from(data, NLMSG.size + CNMSG.size)[0] == EV_NONE
        if not acked:
            raise TimeoutError
    except TimeoutError:
        sock.close()
        raise Unavailable(_SILENT) from None
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot listen to process events: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock
