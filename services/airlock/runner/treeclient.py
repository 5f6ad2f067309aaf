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
from airlock.common.ipc import Client
from airlock.common.wire import exectree as wire
from airlock.runner.endrecord import TREE_BYTES
from airlock.runner.execwatch import Watch

# A watch, claim or live call: the listener answers from memory (its first watch may wait for the
# kernel source to open: the connector's answer is bounded by 0.2 s, fanotify's marks by their count).
CALL_SECONDS = 5.0
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

    async def live(self, id_: int) -> list[int]:
        """The job's processes alive now; none when the listener cannot say (a kill then reaches its groups)."""
        try:
            return list((await self.exectree.call(wire.LIVE, wire.Ref(id_), timeout=CALL_SECONDS)).pids)
        except AirlockError:
            return []

    async def finish(self, w: Watch, id_: int) -> None:
        """Fill ``w`` with what the job executed, or say why it cannot be (``unavailable``)."""
        try:
            tree = await self.exectree.call(wire.FINISH, wire.Finish(id_, TREE_BYTES), timeout=CALL_SECONDS)
        except AirlockError as exc:
            self.follows_forks = False
            w.unavailable = unreachable(f"failed before the job's tree was read: {exc.message}")
            return
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
