"""Declarations of the exec-tree door (internal/exectree.sock): airlock-runner asks
airlock-exectree, the one process that listens to the kernel's process events,
to follow a job and, when it ended, for what the job executed.

The smallest protocol that keeps the runner's trees as they were: ``watch``
before the job's first process starts (by its units' cgroups, or by fork
ancestry from the calling runner), ``claim`` the stages the runner forked
(ancestry), ``live`` for a kill of what left the job's process groups, and
``finish`` for the programs, the reasons the tree may lack one, and the
counts.  ``follow`` is ``watch``, ``claim`` and ``finish`` in one call, for a
runner whose forks the listener follows already: the runner names the job by
its own ``key`` and the reply is the tree, sent the moment the events show
none of the job's processes alive, so it is usually there when the job's end
reaches the runner (issue 47: the ``finish`` round trip was on every exec's
path).  A job that left a process behind is ended by ``finish`` with the key,
which answers both calls.  The runner redacts the job's secrets and fits the tree into
``exec.finished`` itself (runner/treeclient.py): no secret crosses this door.
Only the runner may call it (its uid, `Caller.RUNNER`).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from airlock.common import validate
from airlock.common.wire.verb import Caller, DoorName, Empty, Message, Stub, declare

if typing.TYPE_CHECKING:
    from airlock.common.ipc import Client

DOOR = DoorName.EXECTREE

MAX_UNITS = 1024  # a job's stages' units (a job has at most about 200 stages: runner/endrecord.py)
MAX_PIDS = 4096
MAX_LIMIT = 65536  # programs followed per job at most (runner/execwatch.py MAX_TRACKED)
MAX_REPLY = 8 * 1024 * 1024  # a finished tree's line: ``finish``'s byte budget keeps it far below this


def _count(name: str, value: int, top: int) -> None:
    if not 0 <= value <= top:
        raise validate.bad(name, f"must be between 0 and {top}")


@dataclass(frozen=True)
class Watch(Message):
    """Follow a job: by its units' cgroups (``units``), else by fork ancestry from the caller.

    ``pids``: by ancestry, the stages the caller forked already (claimed at once, as ``claim`` would:
    a runner whose forks the listener follows asks once, after the fork)."""

    units: tuple[str, ...] = ()
    limit: int = 256
    pids: tuple[int, ...] = ()

    def check(self) -> None:
        if self.pids and self.units:
            raise validate.bad("pids", "only a watch by ancestry (no units) claims pids")
        if len(self.pids) > MAX_PIDS or any(p < 1 for p in self.pids):
            raise validate.bad("pids", f"must be at most {MAX_PIDS} process IDs")
        if len(self.units) > MAX_UNITS:
            raise validate.bad("units", f"must be at most {MAX_UNITS} unit names")
        for unit in self.units:
            validate.text("units", unit, max_len=256, allow_empty=False)
        _count("limit", self.limit, MAX_LIMIT)


@dataclass(frozen=True)
class Watching(Message):
    """The job's watch (``id``), or why there is none (``unavailable``; then ``id`` is 0)."""

    id: int
    source: str
    unavailable: str | None = None


def _one_name(id_: int, key: int) -> None:
    _count("id", id_, 2**62)
    _count("key", key, 2**62)
    if bool(id_) == bool(key):
        raise validate.bad("id", "name the job by its watch's id or by the key it is followed by: one of them")


@dataclass(frozen=True)
class Ref(Message):
    """A job: by the ``id`` of its ``watch``, or by the ``key`` of its ``follow``."""

    id: int
    key: int = 0

    def check(self) -> None:
        _one_name(self.id, self.key)


@dataclass(frozen=True)
class Claim(Message):
    """Ancestry: the stages the runner forked for the watch ``id``."""

    id: int
    pids: tuple[int, ...]

    def check(self) -> None:
        _count("id", self.id, 2**62)
        if len(self.pids) > MAX_PIDS or any(p < 1 for p in self.pids):
            raise validate.bad("pids", f"must be at most {MAX_PIDS} process IDs")


@dataclass(frozen=True)
class Finish(Message):
    """The job ended: stop following it; its programs in at most about ``max_bytes`` of JSON.

    The job is named by its watch's ``id``, or by the ``key`` it is followed by (``follow``)."""

    id: int
    max_bytes: int
    key: int = 0

    def check(self) -> None:
        _one_name(self.id, self.key)
        _count("max_bytes", self.max_bytes, 1024 * 1024)


@dataclass(frozen=True)
class Follow(Message):
    """By ancestry, the job whose stages (``pids``) the caller forked, named by the caller's ``key``;
    answered with its tree once no process of the job is alive, or at a ``finish`` with the key."""

    key: int
    pids: tuple[int, ...]
    limit: int = 256
    max_bytes: int = 0

    def check(self) -> None:
        if self.key < 1:
            raise validate.bad("key", "must be at least 1")
        _count("key", self.key, 2**62)
        if not self.pids or len(self.pids) > MAX_PIDS or any(p < 1 for p in self.pids):
            raise validate.bad("pids", f"must be 1 to {MAX_PIDS} process IDs")
        _count("limit", self.limit, MAX_LIMIT)
        _count("max_bytes", self.max_bytes, 1024 * 1024)


@dataclass(frozen=True)
class Live(Message):
    """The job's processes alive as far as the events tell."""

    pids: tuple[int, ...]


@dataclass(frozen=True)
class Tree(Message):
    """What a job executed, as runner/execwatch.py's `Watch` keeps it (the runner renders the record).

    ``processes`` are the programs as execwatch records them (argv, exe, exe_id, uid, times, parent):
    carried as JSON because each is the kernel's and /proc's account, rendered by the runner's
    `Watch.record` and `airlock show`, not acted on; ``missed`` says why the tree may lack a program.
    """

    source: str
    unavailable: str | None = None
    complete: bool = True
    limit: int = 0
    more: int = 0
    missed: tuple[str, ...] = ()
    unattributed: int = 0
    unwatched: dict[str, str] = field(default_factory=dict)
    processes: tuple[dict[str, Any], ...] = ()


_RUNNER = {Caller.RUNNER}

WATCH = declare(DOOR, "watch", _RUNNER, Watch, Watching, "follow a job's processes from before its first starts")
CLAIM = declare(DOOR, "claim", _RUNNER, Claim, Empty, "the stages the runner forked for a job (fork ancestry)")
LIVE = declare(DOOR, "live", _RUNNER, Ref, Live, "a job's processes alive now (a kill's escaped processes)")
FINISH = declare(DOOR, "finish", _RUNNER, Finish, Tree, "the job ended: stop following it, return its tree")
FOLLOW = declare(
    DOOR, "follow", _RUNNER, Follow, Tree, "watch, claim and finish in one: the tree once the job's processes are gone"
)


def stub(client: Client) -> Stub:
    """The exec-tree door's stub over ``client`` (a `common.ipc.Client` to exectree.sock)."""
    return Stub(DOOR, client)
