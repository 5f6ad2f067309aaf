"""One job's exec tree as the kernel's events tell it (`Watch`), and what /proc says of a process.

runner/proctree.py's listener hands each fork, exec and exit to the job that
owns the process; a `Watch` keeps that job's processes (by cgroup or by fork
ancestry), reads each exec's argv, file and uids (`read_process`, bounded), and
renders the tree for ``exec.finished`` within a byte budget.

A tree that may lack a program says so (issue 51): ``complete: false`` with
``incomplete``, each reason once (`Watch.miss`: events the kernel dropped,
more processes than followed, a program run from a filesystem not watched),
and, from fanotify, ``unwatched``: what no mark covers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from airlock.common.codec import canonical_json, iso_utc
from airlock.runner.exechelper import HELPER
from airlock.runner.fanotify import FileSeen
from airlock.runner.gate import _GATE_SHIM
from airlock.runner.redact import redact

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
# Distinct reasons a tree is incomplete, at most (each is short).
MAX_MISSED = 8
# A process's taskstats record follows its exit event within milliseconds: an exited process stays
# findable this long (and at most this many), not for as long as a busy runner's last 8,192 exits.
_EXITED_KEPT = 1024
_EXITED_SECONDS = 2.0


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
        self.finished = False  # its job ended: late events about its processes are not kept for it
        self.source = "proc-connector"
        self.unattributed = 0  # fanotify: execs while this job ran whose process was gone before its cgroup was read
        self.missed: list[str] = []  # why the tree may lack a program (`miss`)
        self.unwatched: dict[str, str] = {}  # fanotify: what no mark covers, and why
        self.gone: Callable[[], None] | None = None  # told once no process of the job is alive (ProcEvents.at_exit)
        self.reply_bytes = 0  # the listener's budget for this job's tree (a `follow`'s max_bytes)

    def miss(self, why: str) -> None:
        """The tree may lack a program: say ``complete: false``, and why (each reason once)."""
        self.complete = False
        if why not in self.missed and len(self.missed) < MAX_MISSED:
            self.missed.append(why)

    @property
    def mode(self) -> str:
        return "cgroup" if self.units else "ancestry"

    def owns_cgroup(self, cgroup: str) -> bool:
        return bool(self.units) and cgroup.rsplit("/", 1)[-1] in self.units

    def fork(self, parent: int, child: int) -> None:
        if len(self.tracked) >= MAX_TRACKED:
            self.miss(f"more than {MAX_TRACKED} processes: later ones were not followed")
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
        self.tell_if_gone()

    def tell_if_gone(self) -> None:
        """Call `gone` once no process of the job is alive: by ancestry none can join it after that."""
        if self.gone is not None and not self.tracked:
            gone, self.gone = self.gone, None
            gone()

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
        for why in other.missed:
            self.miss(why)
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
            return {"source": self.source, "complete": False, "unavailable": self.unavailable}
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
            out["unwatched"] = dict(self.unwatched)
        if not self.complete:
            out["incomplete"] = list(self.missed) or ["events were lost"]
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


def settle_unwatched(entry: dict[str, Any], w: Watch) -> None:
    """fanotify: an exec whose event was only its ELF interpreter, while /proc/PID/exe named a file on a
    filesystem not marked (a memfd, a job's own mount): record that program, flagged, and the tree incomplete."""
    seen = entry.pop("unwatched_exe", None)
    if not seen or "argv" in entry:
        return
    entry["opened"] = entry.get("exe")  # what the event showed: the program's interpreter
    for key in ("argv", "argv_truncated", "exe", "exe_id", "uid", "euid", "ppid"):
        if key in seen:
            entry[key] = seen[key]
    entry.pop("not_read", None)
    entry.pop("exited_before_read", None)
    entry["unwatched"] = True
    w.miss(f"{entry.get('exe')} was executed from a filesystem that is not watched")


def keep_exited(exited: dict[int, tuple[Watch, float]], pid: int, w: Watch, now: float) -> None:
    """Keep an exited process findable for its taskstats record: briefly, and at most `_EXITED_KEPT`.

    Kept for good, a busy runner's finished jobs' trees would pile up (issue 37's RSS row).
    """
    exited[pid] = (w, now)
    while exited:
        oldest = next(iter(exited))
        if len(exited) <= _EXITED_KEPT and now - exited[oldest][1] <= _EXITED_SECONDS:
            return
        del exited[oldest]
