"""Deferred end records made sure of (issue 21): the runner asks the journal which it lost.

``exec.finished`` is deferred: intake's ``request.replied`` commits only with
it.  Off the critical path, `EndRecords` asks the journal (``sync``) which of
the marks it handed out were lost (a restart between queueing and commit, a
failed transaction) and appends those again.  How many wait is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airlock.common.audit import Audit
from airlock.common.errors import AirlockError
from airlock.common.wire.journal import SYNC, Append, Sync

# How many marks one `sync` asks about, how long to wait for a journal that does not answer
# before giving up on them, and how many may wait at all.
CONFIRM_BATCH = 256
CONFIRM_SECONDS = 60.0
MAX_UNCONFIRMED = 10_000


class EndRecords:
    def __init__(self, audit: Audit, log: Any) -> None:
        self.audit = audit
        self.log = log
        self.unconfirmed: dict[str, Append] = {}  # mark -> the event
        self._wake = asyncio.Event()
        self._confirmer: asyncio.Task[None] | None = None

    def add(self, mark: str, event: Append) -> None:
        if len(self.unconfirmed) >= MAX_UNCONFIRMED:  # the journal has not answered for long: bounded
            dropped = next(iter(self.unconfirmed))
            gone = self.unconfirmed.pop(dropped)
            self.log.error(
                "runner.audit.unrecorded",
                operation_id=gone.operation_id,
                code="audit_unavailable",
                error="too many end records waiting for the journal's confirmation",
            )
        self.unconfirmed[mark] = event
        self._wake.set()
        if self._confirmer is None or self._confirmer.done():
            self._confirmer = asyncio.get_running_loop().create_task(self._confirm(), name="runner-confirm")

    async def _confirm(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            marks = list(self.unconfirmed)[:CONFIRM_BATCH]
            if len(self.unconfirmed) > len(marks):
                self._wake.set()
            deadline = asyncio.get_running_loop().time() + CONFIRM_SECONDS
            lost: list[str] | None = None
            while lost is None:
                try:
                    found = await self.audit.journal.call(SYNC, Sync(tuple(marks), "runner"), timeout=10)
                    lost = [m for m in found.lost if m in marks]
                except AirlockError as exc:
                    if asyncio.get_running_loop().time() >= deadline:
                        lost = marks
                        self.log.warning("runner.audit.unconfirmed", count=len(marks), error=exc.message)
                    else:
                        await asyncio.sleep(0.2)
            events = [self.unconfirmed.pop(m) for m in marks]
            for mark, event in zip(marks, events, strict=True):
                if mark not in lost:
                    continue
                try:
                    await self.audit.ensure(event)
                except AirlockError as exc:
                    self.log.error(
                        "runner.audit.unrecorded",
                        operation_id=event.operation_id,
                        code=exc.code.value,
                        error=exc.message,
                    )
