"""Exec trees from fanotify: the kernel source used where the process-events connector is not served.

The connector (runner/proctree.py) answers only listeners in the initial PID
and user namespaces; in a container the runner instead marks the filesystems
jobs execute from with fanotify, ``FAN_OPEN_EXEC`` (Linux 5.0), in the
notification class (``FAN_CLASS_NOTIF``: the kernel never waits for the
runner, so a stalled runner cannot block an exec).  ``FAN_MARK_FILESYSTEM``
marks a whole filesystem, whatever mount namespace or read-only bind mount a
job's sandbox sees it through; it needs CAP_SYS_ADMIN.

Each event names the pid that opened a file for exec and gives an fd of that
file: its identity (``fstat``: device, inode, size, mtime) is the executed
file's, straight from the kernel, and stays known even when the program has
exited before anything else could be read.  The fd is closed at once.

One ``execve`` opens several files: the program, then for a ``#!`` script its
interpreter (itself perhaps a script), then for a dynamically linked ELF its
``PT_INTERP`` loader (ld.so).  One program is recorded per exec: the file
``execve`` was given (the first event), with a script's interpreter named in
``interpreter``.  `Follow` tells the later opens of the same exec from a new
exec by the same pid: after each file it expects the interpreter that file
names (read from the event fd: the ``#!`` line or ELF ``PT_INTERP``), and an
event of that pid for exactly that file (device and inode) is part of the
same exec; anything else is a new exec.

What is marked (issue 51): every filesystem a program can be executed from,
read from ``/proc/self/mountinfo`` (each mount not ``noexec`` of a filesystem
that holds files: tmpfs ``/dev/shm`` and ``/run`` too), again before each job
(`refresh`: a mount that appeared since is marked then).  What cannot be
marked is named (`unwatched`) and makes every tree ``complete: false``: a
mark the kernel refused, and always the memfd filesystem (the kernel refuses
marks on its internal mounts), and filesystems mounted only inside a job's
own mount namespace.  A program run from one of those is still caught when
it has an ELF interpreter: the interpreter's open is the event, and
``/proc/PID/exe`` then names a file on a filesystem not marked
(runner/proctree.py flags it); a static one leaves no event.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import time
from dataclasses import dataclass, field

from airlock.common.codec import iso_utc

FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_NOTIF = 0x1, 0x2, 0x0
FAN_MARK_ADD, FAN_MARK_FILESYSTEM = 0x1, 0x100
FAN_OPEN_EXEC, FAN_Q_OVERFLOW = 0x1000, 0x4000
FAN_NOFD = -1
FANOTIFY_METADATA_VERSION = 3
AT_FDCWD = -100
# struct fanotify_event_metadata: event_len, vers, reserved, metadata_len, mask, fd, pid.
METADATA = struct.Struct("=IBBHQii")
# Filesystems jobs execute from: each distinct device among these that exist is marked (only
# stat'ed and marked: /tmp and /var/tmp are where a job may have put a program, not our files).
EXEC_PATHS: tuple[str, ...] = ("/", "/usr", "/bin", "/sbin", "/usr/local", "/opt", "/home", "/srv", "/root")
EXEC_PATHS += ("/tmp", "/var/tmp")  # noqa: S108
# Filesystems that hold no program a job could execute (the kernel's own views): never marked.
_NO_PROGRAMS = frozenset(
    "proc sysfs cgroup cgroup2 devpts mqueue bpf tracefs debugfs securityfs pstore configfs fusectl "
    "binfmt_misc efivarfs autofs nsfs rpc_pipefs hugetlbfs".split()
)
MOUNTINFO_MAX = 4 * 1024 * 1024
# What no mark can cover, in every tree fanotify records.
BLIND: dict[str, str] = {
    "memfd": "programs run from a memfd (memfd_create, then execveat): the kernel refuses marks on its internal "
    "filesystem; one with an ELF interpreter is still flagged, a static one leaves no entry",
    "job namespaces": "filesystems mounted only inside a job's own mount namespace (a sandbox's private tmpfs)",
}
# How long the files one execve opens are expected to follow each other.
_FOLLOW_SECONDS = 1.0
_MAX_INTERP = 4  # the kernel's own bound on nested #! interpreters (BINPRM_MAX_RECURSION)


@dataclass(frozen=True, slots=True)
class Event:
    mask: int
    fd: int
    pid: int


def parse_events(buf: bytes) -> list[Event]:
    """The events in one read(2) of a fanotify fd (a short or malformed tail is dropped)."""
    out: list[Event] = []
    at = 0
    while at + METADATA.size <= len(buf):
        event_len, vers, _reserved, _metadata_len, mask, fd, pid = METADATA.unpack_from(buf, at)
        if event_len < METADATA.size or vers != FANOTIFY_METADATA_VERSION:
            break
        out.append(Event(mask, fd, pid))
        at += event_len
    return out


@dataclass(frozen=True, slots=True)
class FileSeen:
    """An executed file as the event fd shows it."""

    path: str
    dev: int
    ino: int
    size: int
    mtime: float
    interp: str | None  # the interpreter this file names (#! or PT_INTERP), if any
    script: bool

    @property
    def key(self) -> tuple[int, int]:
        return (self.dev, self.ino)

    def identity(self) -> dict[str, object]:
        return {"dev": self.dev, "ino": self.ino, "size": self.size, "mtime": iso_utc(self.mtime)}


def _elf_interp(head: bytes, fd: int) -> str | None:
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return None
    bits, order = head[4], "<" if head[5] == 1 else ">"
    if bits == 2:
        phoff, phentsize, phnum = (
            struct.unpack_from(order + "Q", head, 32)[0],
            *struct.unpack_from(order + "HH", head, 54),
        )
        layout = struct.Struct(order + "IIQQQQ")  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz
    elif bits == 1:
        phoff, phentsize, phnum = (
            struct.unpack_from(order + "I", head, 28)[0],
            *struct.unpack_from(order + "HH", head, 42),
        )
        layout = struct.Struct(order + "IIIIII")  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz
    else:
        return None
    if phentsize < layout.size or phnum > 256:
        return None
    table = os.pread(fd, phentsize * phnum, phoff)
    for i in range(min(phnum, len(table) // phentsize)):
        fields = layout.unpack_from(table, i * phentsize)
        if fields[0] == 3:  # PT_INTERP
            offset, size = (fields[2], fields[5]) if bits == 2 else (fields[1], fields[4])
            name = os.pread(fd, min(size, 4096), offset).split(b"\0", 1)[0]
            return name.decode("utf-8", "surrogateescape") or None
    return None


def file_seen(fd: int) -> FileSeen | None:
    """What the event's fd is: identity, path, and the interpreter it names; None if unreadable."""
    try:
        st = os.fstat(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        head = os.pread(fd, 256, 0)
        interp: str | None = None
        script = head.startswith(b"#!")
        if script:
            line = head[2:].split(b"\n", 1)[0].strip()
            interp = line.split()[0].decode("utf-8", "surrogateescape") if line else None
        else:
            interp = _elf_interp(head, fd)
    except (OSError, struct.error):
        return None
    return FileSeen(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime, interp, script)


def _key_of(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@dataclass(slots=True)
class _Expect:
    keys: list[tuple[int, int]]
    until: float
    depth: int = 0


@dataclass(slots=True)
class Follow:
    """Per pid, the interpreter the file it just executed names: its open is the same exec, not a new one."""

    expect: dict[int, _Expect] = field(default_factory=dict)

    def is_new_exec(self, pid: int, seen: FileSeen | None, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        pending = self.expect.get(pid)
        same = (
            pending is not None
            and seen is not None
            and pending.until >= now
            and pending.depth <= _MAX_INTERP
            and seen.key in pending.keys
        )
        depth = pending.depth + 1 if same and pending is not None else 0
        self.expect.pop(pid, None)
        if seen is not None and seen.interp:
            key = _key_of(seen.interp)
            if key is not None:
                self.expect[pid] = _Expect([key], now + _FOLLOW_SECONDS, depth)
        if len(self.expect) > 4096:  # stale ones (an exec that failed half way): forget them
            for stale in [p for p, e in self.expect.items() if e.until < now]:
                del self.expect[stale]
        return not same


def _unescape(raw: bytes) -> str:
    """A mountinfo field: spaces, tabs, newlines and backslashes are written as octal escapes."""
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8) & 0xFF]), raw).decode(
        "utf-8", "surrogateescape"
    )


def exec_mounts(mountinfo: bytes) -> list[tuple[int, str]]:
    """(device, mount point) of every mount a program can be executed from: not ``noexec``, holding files."""
    out: list[tuple[int, str]] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(b" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or not tail or b":" not in fields[2]:
            continue
        if b"noexec" in fields[5].split(b",") or tail[0].decode("ascii", "replace") in _NO_PROGRAMS:
            continue
        major, _, minor = fields[2].partition(b":")
        if major.isdigit() and minor.isdigit():
            out.append((os.makedev(int(major), int(minor)), _unescape(fields[4])))
    return out


def _mountinfo(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(MOUNTINFO_MAX)
    except OSError:
        return b""


class Fanotify:
    """A notification-class fanotify fd marking the filesystems jobs execute from."""

    def __init__(self) -> None:
        self.fd = -1
        self.marked: list[str] = []
        self.unmarked: dict[str, str] = {}
        self.devices: set[int] = set()  # the filesystems marked, by device
        self._libc: ctypes.CDLL | None = None

    def open(self, paths: tuple[str, ...] = EXEC_PATHS) -> str | None:
        """Open and mark ``paths`` and every mount a program can run from; the reason when it cannot."""
        # The process's own symbols (glibc's fanotify_*), not find_library("c"): that runs
        # `ldconfig -p` in a subprocess, tens of milliseconds of the first job after a cold start.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
        libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        flags = FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK
        fd = libc.fanotify_init(flags, os.O_RDONLY | os.O_CLOEXEC | os.O_LARGEFILE)
        if fd < 0:
            return f"fanotify_init: {os.strerror(ctypes.get_errno())}"
        self.fd, self._libc = fd, libc
        for path in paths:
            try:
                dev = os.stat(path).st_dev
            except OSError:
                continue
            if not self._mark(dev, path) and path == "/":
                self.close()
                return f"fanotify_mark /: {self.unmarked[path]}"
        self.refresh()
        return None

    def refresh(self) -> None:
        """Mark every filesystem a program can run from that is mounted now and not marked yet.

        The runner's own mounts, and PID 1's (reached through ``/proc/1/root``): jobs are PID 1's units
        and see its mounts, not the runner's (whose unit has a private /dev, so a private /dev/shm).
        """
        for dev, path in exec_mounts(_mountinfo("/proc/self/mountinfo")):
            self._mark(dev, path)
        for dev, path in exec_mounts(_mountinfo("/proc/1/mountinfo")):
            self._mark(dev, "/proc/1/root" + path.rstrip("/"))

    def _mark(self, dev: int, path: str) -> bool:
        if dev in self.devices or self._libc is None:
            return True
        encoded = path.encode("utf-8", "surrogateescape")
        if self._libc.fanotify_mark(self.fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, FAN_OPEN_EXEC, AT_FDCWD, encoded):
            self.unmarked[path] = os.strerror(ctypes.get_errno())
            return False
        self.unmarked.pop(path, None)
        self.devices.add(dev)
        self.marked.append(path)
        return True

    def unwatched(self) -> dict[str, str]:
        """What no mark covers, and why: refused marks (by mount point) and what cannot be marked at all."""
        return {path: f"not marked: {why}" for path, why in sorted(self.unmarked.items())[:16]} | BLIND

    def read(self) -> list[Event]:
        try:
            return parse_events(os.read(self.fd, 65536))
        except BlockingIOError:
            return []

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
