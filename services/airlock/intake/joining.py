"""Retries that join (issue 48): an agent's `sudo`, killed by its tool's timeout, typed again.

A request sent with ``join: true`` may lose its agent while it waits: it
stays pending for ``agents.retry_window_seconds`` from its arrival (approval's
own timeout still bounds it), and runs if approved, its outcome kept for
replay like any other.  A request naming the same operation while the first
is pending or running joins it here: it is told what the first was told
(accepted, pending) and gets the first's outcome, or its error, when it
settles; nothing is asked or run twice.  One that comes after the first
settled is the journal's replay (drive.py's ``op.begin``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from airlock.common import log
from airlock.common.door import Connection
from airlock.common.errors import AirlockError, ErrorCode

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
Key = tuple[int, str]  # (the agent's uid, its operation ID)


@dataclass
class _Flight:
    """One operation on its way, and who is listening for it."""

    done: asyncio.Future[dict[str, Any]]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # accepted, pending_approval
    listeners: int = 0


class Joins:
    """The joinable operations intake is driving now, by (uid, operation ID)."""

    def __init__(self) -> None:
        self.flights: dict[Key, _Flight] = {}
        self.log = log.get()

    async def drive(
        self,
        key: Key,
        start: Callable[[], Awaitable[dict[str, Any]]],
        emit: Emit | None,
        conn: Connection | None = None,
    ) -> dict[str, Any]:
        """Drive the operation (``start``), or join the one already on its way under ``key``."""
        flight = self.flights.get(key)
        if flight is not None:
            return await self._join(key, flight, emit, conn)
        flight = _Flight(asyncio.get_running_loop().create_future())
        self.flights[key] = flight
        try:
            outcome = await start()
        except BaseException as exc:
            flight.done.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            flight.done.exception()  # retrieved: nobody else may be listening
            raise
        finally:
            self.flights.pop(key, None)
        flight.done.set_result(outcome)
        return outcome

    async def _join(self, key: Key, flight: _Flight, emit: Emit | None, conn: Connection | None) -> dict[str, Any]:
        """Wait with the first for its outcome; a joiner that goes away stops listening (the window runs on)."""
        self.log.info("intake.request.joined", peer_uid=key[0], operation_id=key[1])
        flight.listeners += 1
        gone = asyncio.ensure_future(conn.wait_gone()) if conn is not None else None
        try:
            if emit is not None:
                for name, fields in list(flight.events):
                    await emit(name, fields)
            waiting: list[asyncio.Future[Any]] = [flight.done, *([gone] if gone is not None else [])]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not flight.done.done():
                raise AirlockError(ErrorCode.WITHDRAWN, "the agent that joined the request went away")
            outcome = flight.done.result()
        finally:
            flight.listeners -= 1
            if gone is not None:
                gone.cancel()
        return dict(outcome) | {"replay": True, "joined": True}

    def note(self, key: Key, event: str, fields: dict[str, Any]) -> None:
        """What the first request was told before its outcome, told again to each that joins."""
        flight = self.flights.get(key)
        if flight is not None and event in ("accepted", "pending_approval"):
            flight.events.append((event, dict(fields)))

    async def abandoned(self, key: Key, conn: Connection, until: float) -> None:
        """Return once the agent has gone and nobody joined for the rest of the window (``until``, time.time)."""
        while True:
            await conn.wait_gone()
            flight = self.flights.get(key)
            if time.time() >= until and (flight is None or flight.listeners == 0):
                return
            await asyncio.sleep(0.25)
