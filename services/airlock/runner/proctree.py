"""Exec trees: every program a job executed, from the kernel's process-events connector.

One netlink socket per runner (``NETLINK_CONNECTOR``, group ``CN_IDX_PROC``)
receives every fork, exec and exit on the host as it happens; nothing is
polled, so a process that lives for a microsecond is still seen.  Each event
goes to the job that owns the process (runner/execwatch.py's `Watch`):

- **by cgroup** (service containment): a process is the job's when, at its
  exec, ``/proc/PID/cgroup`` names one of the job's units; its forks are the
  job's from then on.  Membership does not depend on the parent, so setsid'd
  and double-forked children are the job's too.
- **by fork ancestry** (process-group and scope containment): the stages the
  runner forked are claimed by pid once started; every process forked from
  them, directly or not, setsid'd or reparented, is the job's.  Forks of the
  runner are followed from the moment they happen and handed to the job that
  claims them (or forgotten: the runner's own helpers).

At an exec ``/proc/PID/{cmdline,exe,status}`` is read at once (execwatch.py); a process
that exited before it could be read keeps what the events told (pid, parent, times; its
file from TASKSTATS: taskstats.py) and says ``exited_before_read``.

The connector works only for a listener with CAP_NET_ADMIN in the initial
PID, user and network namespaces; elsewhere (a container) the tree says
``unavailable`` with the reason.  Events the socket had to drop (``ENOBUFS``)
make every tree recorded meanwhile ``complete: false``.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from airlock.runner import connector
from airlock.runner.connector import CNMSG as _CNMSG
from airlock.runner.connector import DATA_AT as _DATA_AT
from airlock.runner.connector import EV_EXEC, EV_EXIT, EV_FORK
from airlock.runner.connector import EVENT as _EVENT
from airlock.runner.execwatch import (
    _UNCLAIMED_SECONDS,
    MAX_PATH_CHARS,
    MAX_TRACKED,
    Watch,
    _mono_to_wall,
    cgroup_of,
    keep_exited,
    read_process,
    settle_unwatched,
)
from airlock.runner.fanotify import FAN_Q_OVERFLOW, Fanotify, Follow, file_seen
from airlock.runner.taskstats import NLMSG as _NLMSG
from airlock.runner.taskstats import ExitStats

_SWITCH_SECONDS = 0.0002

# fanotify reports an exec when the file is opened, before the new program runs: its argv is
# read once /proc/PID/exe names the executed file, waiting at most this long.
_FAN_READ_SECONDS = 0.05
_FAN_POLL_MS = 1


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
        self.exited: dict[int, tuple[Watch, float]] = {}  # exited lately, oldest first (taskstats may follow)
        self.names: str | None = "not started"  # why programs that exit at once go unnamed, or None
        # Whose forks are followed for jobs followed by ancestry: the runners that asked (runner/exectree.py).
        self.forks_of: set[int] = {os.getpid()}
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

    def open_soon(self) -> threading.Thread:
        """`open` in a thread of its own, holding the lock: the runner is ready without waiting for the
        kernel (a connector that never answers, in a container, costs ACK_SECONDS of every cold start),
        and a job's `watch`, which takes the lock, finds the source decided."""

        def opening() -> None:
            with self.lock:
                self.open()
            if self.unavailable is not None:
                self.log.warning("runner.tree.unavailable", error=self.unavailable)

        thread = threading.Thread(target=opening, name="airlock-proc-events-open", daemon=True)
        thread.start()
        return thread

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
            self.sock = connector.subscribe()
        except connector.Unavailable as exc:
            self.unavailable = str(exc)
            return
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

    def follow_forks_of(self, pid: int) -> None:
        """Follow ``pid``'s forks (a runner that watches a job by ancestry); forget runners that are gone."""
        with self.lock:
            self.forks_of = {p for p in self.forks_of if os.path.exists(f"/proc/{p}")} | {pid}

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
            if self.fan is not None:  # issue 51: mounts that appeared since are marked; the rest is named
                self.fan.refresh()
                w.unwatched = self.fan.unwatched()
                w.miss("not every filesystem is watched: " + ", ".join(sorted(w.unwatched)))
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
                w.miss("a stage's fork event was lost: its earlier programs may be missing")
                self.owner[pid] = w
                continue
            w.absorb(found)
            for tgid in found.tracked:
                self.owner[tgid] = w

    def at_exit(self, w: Watch, gone: Callable[[], None]) -> None:
        """Call ``gone`` (from the reading thread, or now) once the events show none of ``w``'s processes alive."""
        with self.lock:
            self.drain()
            if w.units or w.finished:
                return  # by cgroup a process may join later: only `finish` ends such a watch
            w.gone = gone
            w.tell_if_gone()

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
            w.finished = True
            w.gone = None
            for tgid in [t for t, (o, _at) in self.exited.items() if o is w]:
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
                        w.miss("events were lost: the fanotify queue overflowed")
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
            settle_unwatched(entry, unread.watch)
            del self.unread[pid]
            return
        late = final or time.monotonic() > unread.until
        file = (exe.st_dev, exe.st_ino)
        if self.fan is not None and exe.st_dev not in self.fan.devices and file not in unread.keys:
            # Maybe the program itself, from a filesystem not marked (a memfd): the event was its ld.so.
            entry["unwatched_exe"] = read_process(pid) or entry.get("unwatched_exe")
        if argv and file in unread.keys:
            entry.pop("unwatched_exe", None)
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
        settle_unwatched(entry, unread.watch)
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
            w = self.owner.get(pid) or self.exited.get(pid, (None, 0.0))[0] if pid is not None else None
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
                    for w in [*self.watches, *self.unclaimed.values()]:
                        w.miss("events were lost: the process-events socket overflowed")
                    self.log.warning("runner.tree.events_lost")
                    continue
                self.log.error("runner.tree.failed", error=str(exc))
                self._stop.set()
                self.unavailable = f"process events stopped: {exc.strerror or exc}"
                for w in self.watches:
                    w.miss(self.unavailable)
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
        elif parent in self.forks_of and child not in self.owner:  # (a job may have claimed it before this event)
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
            if w.last.get(pid) is not None and not w.finished:  # its taskstats record may follow
                keep_exited(self.exited, pid, w, time.monotonic())
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
