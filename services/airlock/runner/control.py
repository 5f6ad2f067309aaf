"""Live control of one running job: its exec tree as it grows, and an operator's kill.

`JobControl` is made by the runner's ``exec`` before the job starts and
handed to the spawner, which tells it where the job lives (its units, or the
pids it forked) and through which containment it can be signalled.  A kill
that arrives before the job started cancels it (nothing runs); after, the
signal goes to the whole job: ``KillUnit`` on every stage's unit (its whole
cgroup) in service containment, the scope and the process groups otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable
from typing import Any, Protocol

from airlock.common.codec import iso_utc
from airlock.runner.execwatch import Watch
from airlock.runner.treeclient import TreeClient


class Signallable(Protocol):
    async def signal(self, signum: int) -> None: ...


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class JobControl:
    def __init__(self, trees: TreeClient | None, tree_limit: int, cancel: asyncio.Event) -> None:
        self.trees = trees if tree_limit > 0 else None
        self.tree_limit = tree_limit
        self.cancel = cancel
        self.watch: Watch | None = None
        self.watch_id = 0  # the listener's (airlock-exectree) ID of the job's watch; 0: none
        self._watching: asyncio.Future[tuple[Watch, int]] | None = None
        self._later = False  # by ancestry: the watch goes with the claim (see `begin`)
        self._finishing: asyncio.Future[None] | None = None
        self.containment: Signallable | None = None
        self.killed: dict[str, Any] | None = None
        self.protected: tuple[str | bytes, ...] = ()  # protected values and credentials: out of the tree too
        self.summary: dict[str, Any] = {}  # what `running` lists: the command, as whom, since when

    # --- the exec tree (spawn.py calls these; airlock-exectree follows the job: runner/treeclient.py) ---

    # The listener's calls are off the job's path where the order allows (issue 47's bench: a blocking
    # round trip each was 1 ms of an exec's 11).  By cgroup the watch must exist before the job's first
    # exec, so it is awaited.  By fork ancestry, once the listener follows this runner's forks, the
    # stages' fork events wait for their job in the listener: one watch that claims them is sent after
    # the fork, beside the job (the first job, or one after the listener started again, awaits its
    # watch before the fork and claims after).  finish runs while the runner closes the job's output;
    # `tree` awaits it.

    async def begin(self, units: Iterable[str] = ()) -> None:
        if self.trees is None:
            return
        units = tuple(units)
        if units or not self.trees.follows_forks:
            self.watch, self.watch_id = await self.trees.watch(units, self.tree_limit)
        else:
            self._later = True  # `claim` watches

    async def _watched(self) -> None:
        if self._watching is not None:
            self.watch, self.watch_id = await self._watching
            self._watching = None

    async def claim(self, pids: Iterable[int]) -> None:
        if self.trees is None:
            return
        if self._later:
            self._later = False
            self._watching = asyncio.ensure_future(self.trees.watch((), self.tree_limit, pids))
        elif self.watch is not None and self.watch_id and not self.watch.units:
            await self.trees.claim(self.watch, self.watch_id, pids)

    async def end(self) -> None:
        if self.trees is None:
            return
        await self._watched()
        if self.watch is not None and self.watch_id:
            self._finishing = asyncio.ensure_future(self.trees.finish(self.watch, self.watch_id))
            self.watch_id = 0

    async def tree(self, max_bytes: int) -> dict[str, Any] | None:
        if self._finishing is not None:
            await self._finishing
            self._finishing = None
        return self.watch.record(max_bytes, self.protected) if self.watch is not None else None

    # --- kill ---

    def started(self, containment: Signallable) -> None:
        self.containment = containment

    async def kill(self, signum: int, by: str, reason: str) -> str:
        """Signal the whole job; returns ``running`` or ``not started`` (then it never starts)."""
        self.killed = {"by": by, "signal": signal_name(signum), "reason": reason, "at": iso_utc(time.time())}
        if self.containment is None:
            self.cancel.set()
            return "not started"
        await self.containment.signal(signum)
        await self._signal_escaped(signum)
        return "running"

    async def _signal_escaped(self, signum: int) -> None:
        """Process groups: what left them (setsid, a double fork) is still the job's by ancestry."""
        await self._watched()
        if self.trees is None or self.watch is None or self.watch.units or not self.watch_id:
            return  # under a unit, KillUnit reached the whole cgroup
        groups = set(getattr(self.containment, "pgids", ()))
        # Held by pidfd, then asked again: a pid whose exit the events report meanwhile may already be
        # another process's, and root must never signal that one by its number.
        held: dict[int, int] = {}
        for pid in await self.trees.live(self.watch_id):
            with contextlib.suppress(OSError):
                held[pid] = os.pidfd_open(pid)
        try:
            still = set(await self.trees.live(self.watch_id))
            for pid, fd in held.items():
                try:
                    if pid in still and os.getpgid(pid) not in groups:
                        signal.pidfd_send_signal(fd, signum)
                except OSError:
                    continue  # gone meanwhile
        finally:
            for fd in held.values():
                os.close(fd)
