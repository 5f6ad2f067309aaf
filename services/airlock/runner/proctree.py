"""Exec trees: every program a job executed, from the kernel's process-events connector.

One netlink socket per runner (``NETLINK_CONNECTOR``, group ``CN_IDX_PROC``)
receives every fork, exec and exit on the host as it happens; nothing is
polled, so a process that lives for a microsecond is still seen.  Each event
goes to the job that owns the process (`Watch`):

- **by cgroup** (service containment): a process is the job's when, at its
  exec, ``/proc/PID/cgroup`` names one of the job's units; its forks are the
  job's from then on.  Membership does not depend on the parent, so setsid'd
  and double-forked children are the job's too.
- **by fork ancestry** (process-group and scope containment): the stages the
  runner forked are claimed by pid once started; every process forked from
  them, directly or not, setsid'd or reparented, is the job's.  Forks of the
  runner are followed from the moment they happen and handed to the job that
  claims them (or forgotten: the runner's own helpers).

At an exec the runner reads ``/proc/PID/{cmdline,exe,status}`` at once: argv
(bounded), the executed file's path and identity (``stat`` of
``/proc/PID/exe``: device, inode, size, mtime: the file the kernel executes,
whatever argv[0] or ``comm`` claim), uid and euid.  A process that exited
before it could be read keeps what the events told (pid, parent, times) and
says ``exited_before_read``.

The connector works only for a listener in the initial PID and user
namespaces with CAP_NET_ADMIN (and in the initial network namespace);
elsewhere (a container) the listener never gets the kernel's acknowledgement
and the tree says ``unavailable`` with the reason.  Events the socket had to
drop (its buffer full: ``ENOBUFS``) make every tree recorded meanwhile
``complete: false``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from airlock.common.codec import canonical_json, iso_utc
from airlock.runner.fanotify import FAN_Q_OVERFLOW, Fanotify, FileSeen, Follow, file_seen
from airlock.runner.gate import _GATE_SHIM
from airlock.runner.redact import redact
from airlock.runner.units import HELPER

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3
EV_NONE, EV_FORK, EV_EXEC, EV_EXIT = 0x0, 0x1, 0x2, 0x80000000
_NLMSG = struct.Struct("=IHHII")
_CNMSG = struct.Struct("=IIIIHH")
_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp_ns (CLOCK_MONOTONIC)
_DATA_AT = _NLMSG.size + _CNMSG.size + _EVENT.size
_RCVBUF = 8 * 1024 * 1024
_SWITCH_SECONDS = 0.0002
_ACK_SECONDS = 0.2  # the kernel acknowledges within send(); this only bounds the wait

# Bounds of one process's record.
MAX_ARGS = 32
MAX_ARGV_BYTES = 1024
MAX_PATH_CHARS = 1024
# Processes followed per job at most (alive or not): a fork bomb must not grow the runner.
MAX_TRACKED = 65536
# A runner child no job claimed within this long was one of the runner's own helpers.
_UNCLAIMED_SECONDS = 30.0
# airlock's own exec shims (a unit's exec helper, a scope stage's gate) run as `python3 -I -S -c CODE ...`
# before the job's program: their code is named, not spelled out, in the tree.
_SHIMS = {HELPER: "<airlock exec helper>", _GATE_SHIM: "<airlock scope gate>"}
_EXITED_KEPT = 8192
# fanotify reports an exec when the file is opened, before the new program runs: its argv is
# read once /proc/PID/exe names the executed file, waiting at most this long.
_FAN_READ_SECONDS = 0.05
_FAN_POLL_MS = 1


def _mono_to_wall(ns: int) -> float:
    return time.time() - (time.monotonic_ns() - ns) / 1e9


def read_process(pid: int) -> dict[str, Any]:
    """What /proc says of ``pid`` now: argv (bounded), exe path and identity, uid/euid; {} if it is gone."""
    out: dict[str, Any] = {}
    try:
        exe_stat = os.stat(f"/proc/{pid}/exe")  # first: the file the kernel executes is what matters most
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(MAX_ARGV_BYTES + 1)
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read(4096)
    except OSError:
        return {}
    parts = raw[:MAX_ARGV_BYTES].split(b"\0") if raw else []
    if raw.endswith(b"\0") and len(raw) <= MAX_ARGV_BYTES:
        parts = parts[:-1]
    argv = [p.decode("utf-8", "backslashreplace") for p in parts[:MAX_ARGS]]
    out["argv"] = shims_named(argv)
    if len(raw) > MAX_ARGV_BYTES or len(parts) > MAX_ARGS:
        out["argv_truncated"] = True
    out["exe"] = exe[:MAX_PATH_CHARS]
    out["exe_id"] = {
        "dev": exe_stat.st_dev,
        "ino": exe_stat.st_ino,
        "size": exe_stat.st_size,
        "mtime": iso_utc(exe_stat.st_mtime),
    }
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            out["uid"], out["euid"] = int(fields[1]), int(fields[2])
        elif line.startswith(b"PPid:"):
            out["ppid"] = int(line.split()[1])  # now: the fork event's parent is better, when there was one
    return out


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
    return _NLMSG.pack(_NLMSG.size + len(body), family, 1, 0, 0) + body  # NLM_F_REQUEST


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
            sock.settimeout(_ACK_SECONDS)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF)
            sock.bind((0, 0))
            sock.send(_genl(_GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _nla(_CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")))
            reply = sock.recv(65536)
            family_id = _nlas(reply, _NLMSG.size + 4, len(reply)).get(_CTRL_ATTR_FAMILY_ID)
            if family_id is None:
                raise OSError(errno.ENOENT, "no TASKSTATS family")
            self.family = struct.unpack("=H", family_id[:2])[0]
            # The layout check: our own record must name us, our uid and our executable.
            sock.send(_genl(self.family, _TS_CMD_GET, _nla(_TS_ATTR_PID, struct.pack("=I", os.getpid()))))
            answer = sock.recv(65536)
            if len(answer) >= _NLMSG.size + 4 and _NLMSG.unpack_from(answer, 0)[1] == 2:  # NLMSG_ERROR
                code = -struct.unpack_from("=i", answer, _NLMSG.size)[0]
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
        if len(data) < _NLMSG.size + 4 or _NLMSG.unpack_from(data, 0)[1] != self.family:
            return None
        top = _nlas(data, _NLMSG.size + 4, min(len(data), _NLMSG.unpack_from(data, 0)[0]))
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
        top = _nlas(data, _NLMSG.size + 4, len(data)) if len(data) > _NLMSG.size + 4 else {}
        aggr = top.get(_TS_TYPE_AGGR_PID)
        pid = _nlas(aggr, 0, len(aggr)).get(_TS_TYPE_PID) if aggr is not None else None
        return struct.unpack("=I", pid[:4])[0] if pid is not None else None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def shims_named(argv: list[str]) -> list[str]:
    """argv with airlock's own shim code named (it is ours, long, and would fill the argv bound)."""
    if len(argv) < 5 or argv[1:4] != ["-I", "-S", "-c"]:
        return argv
    code = argv[4]
    for shim, name in _SHIMS.items():
        # The whole code, or a prefix long enough (argv is cut at MAX_ARGV_BYTES) to be no one else's.
        if code == shim or (len(code) >= 200 and shim.startswith(code)):
            return [*argv[:4], name, *argv[5:]]
    return argv


def cgroup_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            for line in f.read(4096).splitlines():
                if line.startswith(b"0::"):
                    return line[3:].decode("utf-8", "replace")
    except OSError:
        return None
    return None


class Watch:
    """One job's processes, as the events tell them."""

    def __init__(self, units: Iterable[str] = (), limit: int = 256) -> None:
        self.units = frozenset(units)  # by cgroup: the job's unit names
        self.limit = limit
        self.tracked: dict[int, int] = {}  # tgid -> the index of its newest exec (-1: none yet)
        self.last: dict[int, int] = {}  # tgid -> the index of its newest exec, kept after it exited
        self.parents: dict[int, int] = {}  # tgid -> the tgid that forked it
        self.execs: list[dict[str, Any]] = []
        self.more = 0
        self.complete = True
        self.unavailable: str | None = None
        self.created = time.monotonic()
        self.unclaimed = False  # a runner child's events, kept until a job claims it
        self.source = "proc-connector"
        self.unattributed = 0  # fanotify: execs while this job ran whose process was gone before its cgroup was read

    @property
    def mode(self) -> str:
        return "cgroup" if self.units else "ancestry"

    def owns_cgroup(self, cgroup: str) -> bool:
        return bool(self.units) and cgroup.rsplit("/", 1)[-1] in self.units

    def fork(self, parent: int, child: int) -> None:
        if len(self.tracked) >= MAX_TRACKED:
            self.complete = False
            return
        self.tracked[child] = -1
        self.parents[child] = parent

    def exec(self, pid: int, at: float) -> None:
        previous = self.tracked.get(pid, -1)
        if previous >= 0:
            self.execs[previous].setdefault("end", iso_utc(at))
        if len(self.execs) >= self.limit:
            self.more += 1
            self.tracked[pid] = -1
            return
        entry: dict[str, Any] = {"pid": pid, "ppid": self.parents.get(pid), "start": iso_utc(at)}
        # A program that executed another in its place (setsid, env, exec in sh) is its parent in the tree.
        parent = self._executed_ancestor(pid) if previous < 0 else previous
        entry["parent"] = parent
        seen = read_process(pid)
        entry |= seen or {"exited_before_read": True}
        if pid in self.parents:
            entry["ppid"] = self.parents[pid]
        self.tracked[pid] = self.last[pid] = len(self.execs)
        self.execs.append(entry)

    def exec_file(self, pid: int, seen: FileSeen | None, at: float) -> int | None:
        """fanotify: ``pid`` executed ``seen``; its entry's index (argv etc. are read later), None past the limit."""
        if len(self.execs) >= self.limit:
            self.more += 1
            return None
        entry: dict[str, Any] = {"pid": pid, "ppid": None, "start": iso_utc(at), "parent": self.last.get(pid)}
        if seen is not None:
            entry["exe"] = seen.path[:MAX_PATH_CHARS]
            entry["exe_id"] = seen.identity()
        self.last[pid] = len(self.execs)
        self.execs.append(entry)
        return len(self.execs) - 1

    def _executed_ancestor(self, pid: int) -> int | None:
        """The newest exec of the nearest ancestor that executed something (subshells fork without exec)."""
        seen = 0
        while (pid := self.parents.get(pid, 0)) and seen < 4096:
            index = self.tracked.get(pid, -1)
            if index >= 0:
                return index
            seen += 1
        return None

    def exit(self, pid: int, at: float, code: int) -> None:
        index = self.tracked.pop(pid, None)
        if index is not None and index >= 0:
            entry = self.execs[index]
            entry.setdefault("end", iso_utc(at))
            if code & 0x7F:
                entry["signal"] = code & 0x7F
            else:
                entry["exit_code"] = (code >> 8) & 0xFF

    def post_mortem(self, pid: int, info: dict[str, Any]) -> None:
        """What taskstats says of a program that exited before /proc could be read."""
        index = self.last.get(pid)
        if index is None or not self.execs[index].get("exited_before_read"):
            return
        self.execs[index] |= {
            "comm": info["comm"],
            "uid": info["uid"],
            "exe_id": {"dev": info["dev"], "ino": info["ino"]},
        }

    def absorb(self, other: Watch) -> None:
        """A runner child's events from before the job claimed it."""
        offset = len(self.execs)
        for entry in other.execs:
            if len(self.execs) >= self.limit:
                self.more += 1
                continue
            parent = entry.get("parent")
            self.execs.append(entry | {"parent": None if parent is None else parent + offset})
        self.more += other.more
        self.complete = self.complete and other.complete
        for pid, index in other.tracked.items():
            self.tracked[pid] = index + offset if 0 <= index + offset < len(self.execs) and index >= 0 else -1
        for pid, index in other.last.items():
            if index + offset < len(self.execs):
                self.last[pid] = index + offset
        self.parents.update(other.parents)

    def record(self, max_bytes: int, protected: Iterable[str | bytes] = ()) -> dict[str, Any]:
        """The tree as exec.finished journals it: at most ``max_bytes`` of JSON, the rest counted as ``more``.

        ``protected`` (the job's protected values and credentials) are redacted from every argument first:
        a program handed a secret on its command line must not put it in the journal."""
        if self.unavailable is not None:
            return {"source": self.source, "unavailable": self.unavailable}
        out: dict[str, Any] = {
            "source": self.source,
            "scope": self.mode,
            "complete": self.complete,
            "limit": self.limit,
            "processes": [],
            "more": self.more,
        }
        if self.source == "fanotify":
            out["ppid"] = "best effort"  # no fork events: /proc/PID/status PPid when the program was read
            out["unattributed"] = self.unattributed
        used = len(canonical_json(out)) + 32
        kept: list[dict[str, Any]] = out["processes"]
        values = tuple(protected)
        for entry in self.execs:
            if values and isinstance(entry.get("argv"), list):
                argv = [redact(str(a).encode(), values).decode("utf-8", "replace") for a in entry["argv"]]
                entry = entry | {"argv": argv}
            size = len(canonical_json(entry)) + 1
            if used + size > max_bytes:
                out["more"] += len(self.execs) - len(kept)
                break
            used += size
            kept.append(entry)
        return out


@dataclass(slots=True)
class _Unread:
    """A job's exec fanotify reported, whose argv, uid and parent are still to be read."""

    watch: Watch
    index: int
    keys: set[tuple[int, int]]
    until: float


class ProcEvents:
    """The runner's one listener; `open` once, then `watch` per job.

    ``source``: ``auto`` (the connector, else fanotify), ``connector`` or ``fanotify`` only."""

    def __init__(self, source: str = "auto") -> None:
        self.prefer = source
        self.source = "proc-connector"
        self.fan: Fanotify | None = None
        self.follow = Follow()
        self.unread: dict[int, _Unread] = {}
        self.sock: socket.socket | None = None
        self.unavailable: str | None = "not started"
        self.watches: list[Watch] = []
        self.owner: dict[int, Watch] = {}  # tgid -> its job's watch (both modes)
        self.unclaimed: dict[int, Watch] = {}  # runner children not claimed yet, by pid
        self.exits = ExitStats()
        self.exited: dict[int, Watch] = {}  # a job's processes that exited lately (their taskstats may follow)
        self.names: str | None = "not started"  # why programs that exit at once go unnamed, or None
        self.pid = os.getpid()
        self.log = structlog.get_logger()
        # A thread of its own reads the events: /proc must be read the moment a program starts
        # (a short one is gone within a millisecond), not when the event loop gets round to it.
        # Every read and every change of the watches happens under the lock, in the kernel's order.
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Subscribe; unavailable (with the reason) when no kernel source is served."""
        if self.prefer != "fanotify":
            self._open_connector()
        if self.unavailable is not None and self.prefer != "connector":
            why = self.unavailable if self.prefer == "auto" else None
            self._open_fanotify()
            if self.unavailable is not None and why is not None:
                self.unavailable = f"{why}; {self.unavailable}"
        if self.unavailable is not None:
            return
        # The reader must get the GIL at once when an event arrives, not after the default 5 ms
        # the event loop may keep it: a program such as id(1) lives for about a millisecond.
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_SECONDS))
        self._thread = threading.Thread(target=self._read, name="airlock-proc-events", daemon=True)
        self._thread.start()

    def _open_fanotify(self) -> None:
        fan = Fanotify()
        why = fan.open()
        if why is not None:
            self.unavailable = f"no fanotify either: {why}"
            return
        if fan.unmarked:
            self.log.warning("runner.tree.fanotify_unmarked", unmarked=fan.unmarked)
        self.fan = fan
        self.source = "fanotify"
        self.unavailable = None
        self.names = None  # the event's fd names every program, exited or not

    def _open_connector(self) -> None:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
        except OSError as exc:
            self.unavailable = f"no process-events connector: {exc.strerror or exc}"
            return
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF)  # SO_RCVBUFFORCE (root)
            sock.bind((0, CN_IDX_PROC))
            body = _CNMSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, 4, 0) + struct.pack("=I", PROC_CN_MCAST_LISTEN)
            sock.send(_NLMSG.pack(_NLMSG.size + len(body), NLMSG_DONE, 0, 0, 0) + body)
            # The kernel answers a listener it accepts with an event of type NONE; one in
            # another PID or user namespace it ignores without a word.
            sock.settimeout(_ACK_SECONDS)
            give_up = time.monotonic() + _ACK_SECONDS
            acked = False
            while not acked and time.monotonic() < give_up:
                data = sock.recv(65536)
                acked = len(data) >= _DATA_AT and _EVENT.unpack_from(data, _NLMSG.size + _CNMSG.size)[0] == EV_NONE
            if not acked:
                raise TimeoutError
        except TimeoutError:
            sock.close()
            self.unavailable = (
                "the kernel's process-events connector did not answer (it serves only the initial PID "
                "and user namespaces: is the runner in a container?)"
            )
            return
        except OSError as exc:
            sock.close()
            self.unavailable = f"cannot listen to process events: {exc.strerror or exc}"
            return
        sock.setblocking(False)
        self.sock = sock
        self.unavailable = None
        self.names = self.exits.open()
        if self.names is not None:
            self.log.warning("runner.tree.taskstats_unavailable", error=self.names)

    def _read(self) -> None:
        poller = select.poll()
        if self.fan is not None:
            poller.register(self.fan.fd, select.POLLIN)
        elif self.sock is not None:
            poller.register(self.sock.fileno(), select.POLLIN)
        else:
            return
        if self.exits.sock is not None:
            poller.register(self.exits.sock.fileno(), select.POLLIN)
        while not self._stop.is_set():
            # Execs whose argv is still to be read are looked at again within a millisecond.
            if poller.poll(_FAN_POLL_MS if self.unread else 500) or self.unread:
                with self.lock:
                    self.drain()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            self._thread = None
        with self.lock:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
            self.exits.close()
            if self.fan is not None:
                self.fan.close()
                self.fan = None

    def watch(self, units: Iterable[str] = (), limit: int = 256) -> Watch:
        w = Watch(units, limit)
        w.source = self.source
        with self.lock:
            if self.unavailable is not None:
                w.unavailable = self.unavailable
                return w
            if self.fan is not None and not w.units:
                w.unavailable = "fanotify (no fork events) follows a job by its cgroup only: service containment"
                return w
            self.drain()
            self.watches.append(w)
        return w

    def claim(self, w: Watch, pids: Iterable[int]) -> None:
        """Ancestry: the job's stages (forked by the runner) and everything they forked so far."""
        with self.lock:
            self._claim(w, pids)

    def _claim(self, w: Watch, pids: Iterable[int]) -> None:
        self.drain()
        for pid in pids:
            found = self.unclaimed.pop(pid, None)
            if found is None:  # its fork event is lost: follow it from now on
                w.tracked.setdefault(pid, -1)
                w.complete = False
                self.owner[pid] = w
                continue
            w.absorb(found)
            for tgid in found.tracked:
                self.owner[tgid] = w

    def live(self, w: Watch) -> list[int]:
        """The job's processes alive as far as the events tell (forked or executed, no exit yet)."""
        with self.lock:
            self.drain()
            return [pid for pid, owner in self.owner.items() if owner is w]

    def finish(self, w: Watch) -> None:
        """The job ended: read what is queued, and stop following its processes."""
        with self.lock:
            self.drain()
            with contextlib.suppress(ValueError):
                self.watches.remove(w)
            for tgid in [t for t, o in self.owner.items() if o is w]:
                del self.owner[tgid]
            for tgid in [t for t, o in self.exited.items() if o is w]:
                del self.exited[tgid]
            for pid in [p for p, u in self.unread.items() if u.watch is w]:
                self._read_exec(pid, final=True)

    def drain(self) -> None:
        """Handle every event queued now (the caller holds the lock)."""
        if self.fan is not None:
            self._drain_fanotify()
            return
        self._drain_events()
        self._drain_exits()

    # --- fanotify: exec opens (runner/fanotify.py) ---

    def _drain_fanotify(self) -> None:
        fan = self.fan
        while fan is not None and (events := fan.read()):
            # Every event's cgroup first, before anything slower: a program such as id(1) is gone
            # (and its cgroup unknowable) within a millisecond.
            jobs = any(x.units for x in self.watches)
            cgroups = [cgroup_of(ev.pid) if jobs and ev.fd >= 0 else None for ev in events]
            for ev, cgroup in zip(events, cgroups, strict=True):
                if ev.mask & FAN_Q_OVERFLOW:
                    for w in self.watches:
                        w.complete = False
                    self.log.warning("runner.tree.events_lost")
                if ev.fd < 0:
                    continue
                try:
                    if jobs:
                        self._exec_opened(ev.pid, ev.fd, cgroup)
                finally:
                    os.close(ev.fd)  # at once: a held fd would keep a deleted binary's space
        for pid in list(self.unread):
            self._read_exec(pid)

    def _exec_opened(self, pid: int, fd: int, cgroup: str | None) -> None:
        if cgroup is None:
            # Gone before its cgroup could be read: it may have been any running job's (or the host's).
            for x in self.watches:
                if x.units:
                    x.unattributed += 1
            return
        w = next((x for x in self.watches if x.owns_cgroup(cgroup)), None)
        if w is None:
            return
        seen = file_seen(fd)
        if not self.follow.is_new_exec(pid, seen):
            # The same exec's interpreter (#!) or loader (ld.so): one program per exec.
            unread = self.unread.get(pid)
            if unread is not None and seen is not None:
                unread.keys.add(seen.key)
                entry = unread.watch.execs[unread.index]
                if entry.get("script") and "interpreter" not in entry:
                    entry["interpreter"] = seen.path[:MAX_PATH_CHARS]
            return
        if pid in self.unread:  # it executed something else before its last program could be read
            self.watches_entry(pid)["replaced_before_read"] = True
            self._read_exec(pid, final=True, argv=False)
        index = w.exec_file(pid, seen, time.time())
        if index is None:
            return
        if seen is not None and seen.script:
            w.execs[index]["script"] = True
        keys = {seen.key} if seen is not None else set()
        self.unread[pid] = _Unread(w, index, keys, time.monotonic() + _FAN_READ_SECONDS)

    def watches_entry(self, pid: int) -> dict[str, Any]:
        unread = self.unread[pid]
        return unread.watch.execs[unread.index]

    def _read_exec(self, pid: int, final: bool = False, argv: bool = True) -> None:
        """Read an exec's argv, uid and parent once /proc/PID/exe is its file; give up at its deadline."""
        unread = self.unread[pid]
        entry = unread.watch.execs[unread.index]
        try:
            exe = os.stat(f"/proc/{pid}/exe")
        except OSError:
            entry["exited_before_read"] = True
            del self.unread[pid]
            return
        late = final or time.monotonic() > unread.until
        if argv and (exe.st_dev, exe.st_ino) in unread.keys:
            seen = read_process(pid)
            if not seen.get("argv") and not late:  # the new program's arguments are not in place yet
                return
            for key in ("argv", "argv_truncated", "uid", "euid", "ppid"):
                if key in seen:
                    entry[key] = seen[key]
            if not seen:
                entry["exited_before_read"] = True
        elif not late:
            return
        elif argv:
            entry["not_read"] = "its exec did not complete in time, or it executed something else"
        if entry.get("parent") is None and entry.get("ppid"):
            entry["parent"] = self._fan_parent(unread.watch, entry["ppid"])
        del self.unread[pid]

    @staticmethod
    def _fan_parent(w: Watch, ppid: int) -> int | None:
        """The newest program of the nearest ancestor (by PPid now) the job executed: best effort."""
        pid = ppid
        for _ in range(16):
            index = w.last.get(pid)
            if index is not None:
                return index
            try:
                with open(f"/proc/{pid}/status", "rb") as f:
                    status = f.read(4096)
            except OSError:
                return None
            pid = next((int(x.split()[1]) for x in status.splitlines() if x.startswith(b"PPid:")), 0)
            if pid <= 1:
                return None
        return None

    def _drain_exits(self) -> None:
        sock = self.exits.sock
        while sock is not None:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    continue
                self.exits.close()
                return
            pid = self.exits.pids(data)
            w = self.owner.get(pid) or self.exited.get(pid) if pid is not None else None
            if w is not None and pid is not None:
                parsed = self.exits._parse(data)
                if parsed is not None:
                    w.post_mortem(pid, parsed[1])

    def _drain_events(self) -> None:
        sock = self.sock
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # the kernel dropped events: say so, carry on
                    for w in self.watches:
                        w.complete = False
                    for u in self.unclaimed.values():
                        u.complete = False
                    self.log.warning("runner.tree.events_lost")
                    continue
                self.log.error("runner.tree.failed", error=str(exc))
                self._stop.set()
                self.unavailable = f"process events stopped: {exc.strerror or exc}"
                for w in self.watches:
                    w.complete = False
                return
            self._handle(data)

    def _handle(self, data: bytes) -> None:
        at = 0
        while at + _DATA_AT <= len(data):
            length = _NLMSG.unpack_from(data, at)[0]
            if length < _DATA_AT:
                return
            what, _cpu, ts = _EVENT.unpack_from(data, at + _NLMSG.size + _CNMSG.size)
            body = at + _DATA_AT
            if what == EV_FORK and at + length >= body + 16:
                _ppid, ptgid, cpid, ctgid = struct.unpack_from("=IIII", data, body)
                if cpid == ctgid:  # a process, not a thread
                    self._fork(ptgid, ctgid)
            elif what == EV_EXEC and at + length >= body + 8:
                _pid, tgid = struct.unpack_from("=II", data, body)
                self._exec(tgid, _mono_to_wall(ts))
            elif what == EV_EXIT and at + length >= body + 12:
                pid, tgid, code = struct.unpack_from("=III", data, body)
                if pid == tgid:
                    self._exit(tgid, _mono_to_wall(ts), code)
            at += (length + 3) & ~3

    def _fork(self, parent: int, child: int) -> None:
        w = self.owner.get(parent)
        if w is not None:
            w.fork(parent, child)
            self.owner[child] = w
        elif parent == self.pid:
            if len(self.unclaimed) > 1024:
                self._forget_old()
            u = Watch(limit=MAX_TRACKED)
            u.unclaimed = True
            u.fork(parent, child)
            u.parents.pop(child, None)  # its parent is the runner, not part of the job
            self.unclaimed[child] = u
            self.owner[child] = u

    def _exec(self, pid: int, at: float) -> None:
        w = self.owner.get(pid)
        # A runner child no job claimed yet may be a job's all the same when it executes in a job's
        # cgroup (a job's cgroup is the stronger claim).
        if (w is None or w.unclaimed) and any(x.units for x in self.watches):
            cgroup = cgroup_of(pid)
            found = None if cgroup is None else next((x for x in self.watches if x.owns_cgroup(cgroup)), None)
            if found is not None:
                self.unclaimed.pop(pid, None)
                self.owner[pid] = w = found
                w.tracked.setdefault(pid, -1)
        if w is not None:
            w.exec(pid, at)

    def _exit(self, pid: int, at: float, code: int) -> None:
        w = self.owner.pop(pid, None)
        if w is not None:
            w.exit(pid, at, code)
            if w.last.get(pid) is not None:
                # Its taskstats record may come after this event (another socket): keep it findable.
                self.exited[pid] = w
                if len(self.exited) > _EXITED_KEPT:
                    del self.exited[next(iter(self.exited))]
        u = self.unclaimed.get(pid)
        if u is not None and time.monotonic() - u.created > _UNCLAIMED_SECONDS:
            self._drop(pid)

    def _forget_old(self) -> None:
        now = time.monotonic()
        for pid in [p for p, u in self.unclaimed.items() if now - u.created > _UNCLAIMED_SECONDS]:
            self._drop(pid)

    def _drop(self, pid: int) -> None:
        u = self.unclaimed.pop(pid, None)
        if u is not None:
            for tgid in [t for t, o in self.owner.items() if o is u]:
                del self.owner[tgid]
