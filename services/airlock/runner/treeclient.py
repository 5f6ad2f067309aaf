"""The runner's side of the exec-tree door: ask airlock-exectree to follow a job, and get its tree.

The listener (runner/exectree.py) holds the kernel's process events so that
the runner holds none of the rights they take.  Each call is bounded
(``CALL_SECONDS``); a listener that is absent, slow or failing never stops a
job: the job runs, and its tree says why it is missing (``complete: false``
with ``unavailable``: the listener could not be reached, or failed before
the job's tree was read).  The tree arrives as the listener kept it; the
runner redacts the job's secrets and fits it into ``exec.finished`` itself
(execwatch.py `Watch.record`).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable
from pathlib import Path

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client, Unreachable
from airlock.common.wire import exectree as wire
from airlock.runner.endrecord import TREE_BYTES
from airlock.runner.execwatch import Watch

# A watch, claim or live call: the listener answers from memory (its first watch may wait for the
# kernel source to open: the connector's answer is bounded by 0.2 s, fanotify's marks by their count).
CALL_SECONDS = 5.0
# `follow` waits for the job; the job's end (its own timeout bounds it) sends finish, which answers it.
FOLLOW_SECONDS = 14 * 24 * 3600.0
SOURCE = "airlock-exectree"  # the tree's source when the listener said nothing of its own


def unreachable(why: str) -> str:
    return f"the exec-tree listener (airlock-exectree) {why}"


class TreeClient:
    """One per runner: the stub over a pooled connection to exectree.sock."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.exectree = wire.stub(Client(path, service="airlock-exectree", unavailable=ErrorCode.INTERNAL))
        self.source = SOURCE  # the last source the listener named
        # The listener follows this runner's forks (a watch by ancestry was answered): a job's watch
        # by ancestry need not be awaited before its stages are forked (runner/control.py).
        self.follows_forks = False
        self._keys = 0  # the runner's names of the jobs it follows (`follow`), unique in this process

    def wake(self) -> None:
        """Connect once and hang up, without waiting: socket activation starts the listener now, so its
        kernel source is open before the first job asks (as the runner's own listener used to be)."""
        kind = socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, kind) as sock:
            sock.connect(str(self.path))

    async def watch(self, units: Iterable[str], limit: int, pids: Iterable[int] = ()) -> tuple[Watch, int]:
        """A job's watch and its listener ID (0: none; the watch then says why, ``unavailable``).

        ``pids``: by ancestry, the stages forked already, claimed in the same call."""
        w = Watch(units, limit)
        w.source = self.source
        ask = wire.Watch(tuple(w.units), limit, tuple(pids))
        try:
            got = await self.exectree.call(wire.WATCH, ask, timeout=CALL_SECONDS)
        except AirlockError as exc:
            self.follows_forks = False  # a listener started again follows no one yet
            w.unavailable = unreachable(f"could not be reached: {exc.message}")
            return w, 0
        self.follows_forks = self.follows_forks or (not w.units and got.unavailable is None)
        w.source = self.source = got.source
        w.unavailable = got.unavailable
        return w, got.id

    async def claim(self, w: Watch, id_: int, pids: Iterable[int]) -> None:
        try:
            await self.exectree.call(wire.CLAIM, wire.Claim(id_, tuple(pids)), timeout=CALL_SECONDS)
        except AirlockError as exc:
            w.miss(unreachable(f"did not take the job's stages: {exc.message}"))

    async def live(self, id_: int, key: int = 0) -> list[int]:
        """The job's processes alive now; none when the listener cannot say (a kill then reaches its groups)."""
        try:
            return list((await self.exectree.call(wire.LIVE, wire.Ref(id_, key), timeout=CALL_SECONDS)).pids)
        except AirlockError:
            return []

    async def finish(self, id_: int, key: int = 0) -> wire.Tree | AirlockError:
        """Stop following the job (by its watch's id, or the key it is followed by): its tree, or why not."""
        try:
            return await self.exectree.call(wire.FINISH, wire.Finish(id_, TREE_BYTES, key), timeout=CALL_SECONDS)
        except AirlockError as exc:
            return exc

    def new_key(self) -> int:
        self._keys += 1
        return self._keys

    async def follow(self, key: int, limit: int, pids: Iterable[int]) -> wire.Tree | AirlockError:
        """By ancestry: watch the job whose stages are ``pids`` under ``key``; its tree once none of its
        processes is alive.  Bounded by the job: its end sends `finish` with the key, which answers this."""
        ask = wire.Follow(key, tuple(pids), limit, TREE_BYTES)
        try:
            return await self.exectree.call(wire.FOLLOW, ask, timeout=FOLLOW_SECONDS)
        except Unreachable as exc:
            if isinstance(exc.cause, OSError):  # never connected: the job was never followed
                self.follows_forks = False
                return wire.Tree(self.source, unreachable(f"could not be reached: {exc.message}"), complete=False)
            return exc
        except AirlockError as exc:
            return exc

    @staticmethod
    def fill(w: Watch, got: wire.Tree | AirlockError) -> None:
        """``w`` with what the job executed, or why it cannot say (``unavailable``)."""
        if isinstance(got, AirlockError):
            w.unavailable = unreachable(f"failed before the job's tree was read: {got.message}")
            return
        tree = got
        w.source = tree.source
        w.unavailable = tree.unavailable
        w.limit = tree.limit
        w.execs = [dict(p) for p in tree.processes]
        w.more = tree.more
        w.unattributed = tree.unattributed
        w.unwatched = dict(tree.unwatched)
        for why in tree.missed:
            w.miss(why)
        w.complete = w.complete and tree.complete
        w.finished = True

    def close(self) -> None:
        self.exectree.close()
