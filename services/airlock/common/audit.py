"""How a service records an audit event: durably in the journal, then in journald.

The journal append returns only once the record is committed; only then is
the same event logged (with its MESSAGE_ID and AIRLOCK_* fields), so what
journald shows is never ahead of the audit store.  If the journal cannot be
reached the caller gets ``audit_unavailable`` and must not go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

from airlock import __version__
from airlock.common import log, validate
from airlock.common.codec import canonical_json
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client, Unreachable
from airlock.common.kinds import MAX_MARKS, message_id
from airlock.common.peer import user_name
from airlock.common.sentence import sentence
from airlock.common.server import Connection, Service, write_timeout
from airlock.common.wire.journal import APPEND, EVENTS, Append, Appended, Events
from airlock.common.wire.verb import DoorName, Stub

# An append whose fate is unknown (see `Audit._settle`): how long to wait for the
# journal to come back, and how many of the request's newest events to look through.
SETTLE_SECONDS = 10.0
SETTLE_WINDOW = 64


@dataclass(frozen=True, slots=True)
class Ids:
    """What ties an audit event to a request: the journald fields that find it."""

    request_id: str | None = None
    operation_id: str | None = None
    peer_uid: int | None = None
    session: str | None = None


def lifecycle(service: Service, audit: Audit) -> None:
    """Journal service.started, service.stopping and connection.dropped (best effort: never blocks a start)."""

    async def started() -> None:
        try:
            await audit.record(
                "service.started", payload={"service": service.name, "pid": os.getpid(), "version": __version__}
            )
        except AirlockError as exc:
            audit.log.warning(f"{service.name}.audit.unavailable", error=exc.message)

    async def stopping() -> None:
        await audit.record("service.stopping", payload={"service": service.name, "pid": os.getpid()})

    async def dropped(conn: Connection, reason: str) -> None:
        try:
            await audit.record(
                "connection.dropped",
                Ids(peer_uid=conn.peer.uid),
                payload={
                    "door": conn.door.name,
                    "reason": reason,
                    "peer_pid": conn.peer.pid,
                    "write_timeout_seconds": write_timeout(service.config, conn.door),
                },
            )
        except AirlockError as exc:
            audit.log.warning(f"{service.name}.audit.unavailable", error=exc.message)

    service.on_started = started
    service.on_stop = stopping
    service.on_dropped = dropped


class Audit:
    def __init__(self, config: Config, writer: str) -> None:
        self.writer = writer
        # The service's journal door (its one client; intake's combined verbs go through it too).
        self.journal = Stub(
            DoorName.JOURNAL,
            Client(config.socket_path("journal"), service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE),
        )
        self.log = log.get()

    def event(self, kind: str, ids: Ids | None = None, payload: dict[str, Any] | None = None) -> Append:
        """The journal's ``append`` arguments for one event (also carried by combined verbs)."""
        ids = ids or Ids()
        return Append(
            kind,
            writer=self.writer,
            request_id=ids.request_id,
            operation_id=ids.operation_id,
            peer_uid=ids.peer_uid,
            session=ids.session or None,
            payload=payload or {},
        )

    def logged(
        self,
        kind: str,
        ids: Ids | None,
        seq: Any,
        log_fields: dict[str, Any] | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None:
        """Log an event the journal has committed: journald never runs ahead of the store.

        With its ``payload``, the entry's MESSAGE is a sentence a person reads
        (`sentence.sentence`: who, as whom, what, who decided, the outcome);
        the structured fields are the same either way.
        """
        ids = ids or Ids()
        said = sentence(kind, payload, ids.request_id, ids.peer_uid, user_name) if payload is not None else None
        self.log.info(
            kind if kind.startswith(self.writer + ".") else f"{self.writer}.{kind}",
            **({"message": said} if said is not None else {}),
            message_id=message_id(kind),
            kind=kind,
            request_id=ids.request_id,
            operation_id=ids.operation_id,
            peer_uid=ids.peer_uid,
            session=ids.session or None,
            seq=seq,
            **(log_fields or {}),
        )

    async def record(
        self,
        kind: str,
        ids: Ids | None = None,
        *,
        payload: dict[str, Any] | None = None,
        log_fields: dict[str, Any] | None = None,
        after: list[str] | None = None,
        said: dict[str, Any] | None = None,
    ) -> Appended:
        """Append durably; with ``after``, only if those deferred records of the request are durable too.

        ``said``: what journald's sentence is made from when the record names
        part of it by digest only (``exec.started`` names the spec that
        ``request.received`` holds; the sentence still spells the command).
        """
        event = self.event(kind, ids, payload)
        if after:
            event = dataclasses.replace(event, after=tuple(after))
        try:
            result = await self.journal.call(APPEND, event)
        except Unreachable as exc:
            if not exc.maybe_done or not event.request_id:
                raise
            result = await self._settle(event, exc)
        self.logged(kind, ids, result.seq, log_fields, said if said is not None else payload or {})
        return result

    async def defer(
        self,
        kind: str,
        ids: Ids | None = None,
        *,
        payload: dict[str, Any] | None = None,
        log_fields: dict[str, Any] | None = None,
        after: list[str] | None = None,
    ) -> str:
        """Queue an event without waiting for its commit (issue 21); return its mark.

        The record becomes durable with the next durable append that names the
        mark in ``after`` (`record`), which fails if it was lost.  Logged at
        once, with ``durable=False``: journald may show it before the store has it.
        """
        event = dataclasses.replace(
            self.event(kind, ids, payload), durable=False, after=tuple(after) if after else None
        )
        mark = (await self.journal.call(APPEND, event)).mark
        if mark is None:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the journal did not queue the record")
        self.logged(kind, ids, None, (log_fields or {}) | {"durable": False}, payload or {})
        return mark

    async def ensure(self, event: Append) -> Appended:
        """Make sure ``event`` (as `event` builds it) is in the journal: append it unless the request's trail has it."""
        return await self._settle(event, AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the journal did not answer"))

    async def _settle(self, event: Append, lost: AirlockError) -> Appended:
        """The journal read this append and died before answering: it may or may not have committed it.

        Sending it again blindly would write it twice when it had (a second
        ``exec.started`` for one request); giving up would lose it when it had
        not (an ``exec.finished`` missing after the work ran).  So: once the
        journal answers again (within `SETTLE_SECONDS`), look for it in the
        request's newest events -- same kind, writer and payload -- and append
        it only if it is not there.  A request's trail holds each lifecycle
        record once, so a match is this record.
        """
        deadline = time.monotonic() + SETTLE_SECONDS
        ask = Events(tail=SETTLE_WINDOW, scope={"request_id": event.request_id})
        while True:
            try:
                page = await self.journal.call(EVENTS, ask, timeout=5)
                break
            except AirlockError:
                if time.monotonic() >= deadline:
                    raise lost from None
                await asyncio.sleep(0.1)
        mine = canonical_json(event.payload)
        for found in page.events:
            if (found.get("kind"), found.get("writer"), found.get("operation_id")) == (
                event.kind,
                event.writer,
                event.operation_id,
            ) and canonical_json(found.get("payload")) == mine:
                self.log.info(
                    f"{self.writer}.append.settled",
                    kind=event.kind,
                    request_id=event.request_id,
                    seq=found.get("seq"),
                    found=True,
                )
                return Appended(found.get("seq"), found.get("hash"))
        self.log.info(f"{self.writer}.append.settled", kind=event.kind, request_id=event.request_id, found=False)
        return await self.journal.call(APPEND, event)


def marks_of(untrusted: Any) -> list[str]:
    """intake's ``after``: the marks of the request's deferred journal records."""
    if untrusted is None:
        return []
    if not isinstance(untrusted, list) or len(untrusted) > MAX_MARKS:
        raise validate.bad("after", f"must be a list of at most {MAX_MARKS} marks")
    return [validate.text("after", m, max_len=64, allow_empty=False) for m in untrusted]
