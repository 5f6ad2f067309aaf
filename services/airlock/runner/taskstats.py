"""The kernel's per-task exit accounting (TASKSTATS), and the netlink framing exec trees share.

What a program that ended too soon to be read by /proc was: the TASKSTATS
generic netlink family sends a record for every exit to a registered
listener, with the task's comm, uid and the device and inode of the file it
executed.  runner/proctree.py listens; this module speaks the protocol.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
from typing import Any

NLMSG = struct.Struct("=IHHII")  # a netlink message header (the connector's too)
RCVBUF = 8 * 1024 * 1024
ACK_SECONDS = 0.2  # the kernel acknowledges within send(); this only bounds the wait

# --- taskstats: what a program that ended too soon to be read was -------------------------
#
# The kernel's per-task accounting (generic netlink family TASKSTATS) sends a record for
# every exit to a registered listener, with the task's comm, uid and (struct taskstats
# version 11 on) the device and inode of the file it executed.  It names the programs that
# exited before /proc could be read.  The offsets below are checked at start against the
# runner's own record; a kernel whose record does not match is not used.
_GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _CTRL_ATTR_FAMILY_ID, _CTRL_ATTR_FAMILY_NAME = 16, 3, 1, 2
_TS_CMD_GET, _TS_CMD_NEW = 1, 2
_TS_ATTR_PID, _TS_ATTR_REGISTER_CPUMASK = 1, 3
_TS_TYPE_PID, _TS_TYPE_STATS, _TS_TYPE_AGGR_PID = 1, 3, 4
_TS_COMM, _TS_UID, _TS_PID, _TS_EXE = slice(80, 112), 120, 128, 384


def _nla(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def _nlas(buf: bytes, at: int, end: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    while at + 4 <= end:
        size, kind = struct.unpack_from("=HH", buf, at)
        if size < 4:
            break
        out[kind & 0x3FFF] = buf[at + 4 : at + size]
        at += (size + 3) & ~3
    return out


def _genl(family: int, cmd: int, attrs: bytes) -> bytes:
    body = struct.pack("=BBH", cmd, 1, 0) + attrs
    return NLMSG.pack(NLMSG.size + len(body), family, 1, 0, 0) + body  # NLM_F_REQUEST


def _stats_of(stats: bytes) -> dict[str, Any] | None:
    if len(stats) < _TS_EXE + 16:
        return None
    dev, ino = struct.unpack_from("=QQ", stats, _TS_EXE)
    return {
        "comm": stats[_TS_COMM].split(b"\0", 1)[0].decode("utf-8", "backslashreplace"),
        "uid": struct.unpack_from("=I", stats, _TS_UID)[0],
        "pid": struct.unpack_from("=I", stats, _TS_PID)[0],
        "dev": dev,
        "ino": ino,
    }


class ExitStats:
    """The TASKSTATS listener: (pid, what it was) for every process that exits."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.family = 0

    def open(self) -> str | None:
        """Register for every CPU's exits; the reason when it cannot (then nothing is lost but names)."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 16)  # NETLINK_GENERIC
        except OSError as exc:
            return f"no generic netlink: {exc.strerror or exc}"
        try:
            sock.settimeout(ACK_SECONDS)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)
            sock.bind((0, 0))
            sock.send(_genl(_GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _nla(_CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")))
            reply = sock.recv(65536)
            family_id = _nlas(reply, NLMSG.size + 4, len(reply)).get(_CTRL_ATTR_FAMILY_ID)
            if family_id is None:
                raise OSError(errno.ENOENT, "no TASKSTATS family")
            self.family = struct.unpack("=H", family_id[:2])[0]
            # The layout check: our own record must name us, our uid and our executable.
            sock.send(_genl(self.family, _TS_CMD_GET, _nla(_TS_ATTR_PID, struct.pack("=I", os.getpid()))))
            answer = sock.recv(65536)
            if len(answer) >= NLMSG.size + 4 and NLMSG.unpack_from(answer, 0)[1] == 2:  # NLMSG_ERROR
                code = -struct.unpack_from("=i", answer, NLMSG.size)[0]
                raise OSError(code, os.strerror(code))
            mine = self._parse(answer)
            exe = os.stat("/proc/self/exe")
            if (
                not mine
                or mine[1]["pid"] != os.getpid()
                or (mine[1]["dev"], mine[1]["ino"]) != (exe.st_dev, exe.st_ino)
            ):
                raise OSError(errno.EPROTO, "taskstats records are not laid out as expected")
            cpus = f"0-{(os.cpu_count() or 1) - 1}".encode() + b"\0"
            sock.send(_genl(self.family, _TS_CMD_GET, _nla(_TS_ATTR_REGISTER_CPUMASK, cpus)))
        except (OSError, TimeoutError) as exc:
            sock.close()
            return f"taskstats unavailable: {getattr(exc, 'strerror', None) or exc}"
        sock.setblocking(False)
        self.sock = sock
        return None

    def _parse(self, data: bytes) -> tuple[int, dict[str, Any]] | None:
        if len(data) < NLMSG.size + 4 or NLMSG.unpack_from(data, 0)[1] != self.family:
            return None
        top = _nlas(data, NLMSG.size + 4, min(len(data), NLMSG.unpack_from(data, 0)[0]))
        aggr = top.get(_TS_TYPE_AGGR_PID)
        if aggr is None:
            return None
        inner = _nlas(aggr, 0, len(aggr))
        pid, stats = inner.get(_TS_TYPE_PID), inner.get(_TS_TYPE_STATS)
        if pid is None or stats is None:
            return None
        info = _stats_of(stats)
        return (struct.unpack("=I", pid[:4])[0], info) if info is not None else None

    def pids(self, data: bytes) -> int | None:
        """The pid an exit record is about, read cheaply (most are not a job's)."""
        top = _nlas(data, NLMSG.size + 4, len(data)) if len(data) > NLMSG.size + 4 else {}
        aggr = top.get(_TS_TYPE_AGGR_PID)
        pid = _nlas(aggr, 0, len(aggr)).get(_TS_TYPE_PID) if aggr is not None else None
        return struct.unpack("=I", pid[:4])[0] if pid is not None else None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
