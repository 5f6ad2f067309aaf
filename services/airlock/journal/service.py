"""airlock-journal: the one writer of the audit store.

It serves ``internal/journal.sock`` to the other services.  The writer of an
event is taken from the connection's SO_PEERCRED, never from the message:
a uid that belongs to one service can only write as that service.  (Under
`airlock dev up` every service runs as the same user; then the uid maps to
several services and the message's ``writer`` picks among exactly those.)
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping
from typing import Any

from airlock import __version__
from airlock.common import daemon, validate
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import AllowList, Peer, uid_of
from airlock.common.server import Call, Door, Service
from airlock.journal.store import Store

NAME = "journal"


def writers_by_uid(config: Config) -> dict[int, set[str]]:
    table: dict[int, set[str]] = {}
    for service, user in (
        ("intake", config.services.intake_user),
        ("approval", config.services.approval_user),
        ("runner", config.services.runner_user),
    ):
        uid = uid_of(user)
        if uid is not None:
            table.setdefault(uid, set()).add(service)
    return table


class Journal:
    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self.writers = writers_by_uid(config)

    def writer_for(self, peer: Peer, claimed: Any) -> str:
        allowed = self.writers.get(peer.uid, set())
        if len(allowed) == 1:
            return next(iter(allowed))
        if isinstance(claimed, str) and claimed in allowed:
            return claimed
        raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")

    async def append(self, call: Call) -> dict[str, Any]:
        return await self._append(call.peer, call.args)

    async def _append(self, peer: Peer, a: dict[str, Any]) -> dict[str, Any]:
        payload = a.get("payload") or {}
        if not isinstance(payload, dict):
            raise validate.bad("payload", "must be an object")
        event = await self.store.append(
            writer=self.writer_for(peer, a.get("writer")),
            kind=validate.text("kind", a.get("kind"), max_len=64),
            request_id=validate.optional_text("request_id", a.get("request_id"), max_len=256),
            operation_id=validate.optional_text("operation_id", a.get("operation_id"), max_len=256),
            peer_uid=validate.integer("peer_uid", a.get("peer_uid")),
            session=validate.optional_text("session", a.get("session"), max_len=256),
            payload=payload,
        )
        return {"seq": event.seq, "hash": event.hash}

    async def _event(self, peer: Peer, event: Any) -> dict[str, Any]:
        """Append the event a combined verb carries (one round trip less per request)."""
        if event is None:
            return {}
        if not isinstance(event, dict):
            raise validate.bad("event", "must be an object")
        appended = await self._append(peer, event)
        return {"event": appended}

    async def op_begin(self, call: Call) -> dict[str, Any]:
        """Claim the request ID (optional), journal the event (optional), then begin the operation."""
        self.writer_for(call.peer, "intake")
        a = call.args
        operation_id = validate.text("operation_id", a.get("operation_id"), max_len=256, allow_empty=False)
        digest = validate.text("digest", a.get("digest"), max_len=128, allow_empty=False)
        has_protected = validate.boolean("has_protected", a.get("has_protected"), False)
        claim = a.get("claim")
        if claim is not None:
            if not isinstance(claim, dict):
                raise validate.bad("claim", "must be an object")
            if not (await self._claim(claim))["claimed"]:
                return {"claimed": False}
        out = await self._event(call.peer, a.get("event"))
        result = await self.store.op_begin(operation_id, digest, has_protected=has_protected)
        return out | {"claimed": True, "state": result.state, "outcome": result.outcome}

    async def op_complete(self, call: Call) -> dict[str, Any]:
        self.writer_for(call.peer, "intake")
        a = call.args
        outcome = a.get("outcome")
        if not isinstance(outcome, dict):
            raise validate.bad("outcome", "must be an object")
        # Submitted together, the outcome and the event land in one group commit.
        out: dict[str, Any]
        _, out = await asyncio.gather(
            self.store.op_complete(
                validate.text("operation_id", a.get("operation_id"), max_len=256, allow_empty=False),
                validate.text("digest", a.get("digest"), max_len=128, allow_empty=False),
                outcome,
            ),
            self._event(call.peer, a.get("event")),
        )
        return out

    async def op_abandon(self, call: Call) -> dict[str, Any]:
        self.writer_for(call.peer, "intake")
        await self.store.op_abandon(validate.text("operation_id", call.args.get("operation_id"), max_len=256))
        return await self._event(call.peer, call.args.get("event"))

    async def request_claim(self, call: Call) -> dict[str, Any]:
        """Intake's replay guard: claim a request ID for the replay window, durably."""
        self.writer_for(call.peer, "intake")
        return await self._claim(call.args)

    async def _claim(self, a: dict[str, Any]) -> dict[str, Any]:
        window = a.get("window_seconds")
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise validate.bad("window_seconds", "must be a number")
        claimed = await self.store.claim_request_id(
            validate.text("key", a.get("key"), max_len=512, allow_empty=False), float(window)
        )
        return {"claimed": claimed}

    async def events(self, call: Call) -> dict[str, Any]:
        a = call.args
        scope = a.get("scope")
        if scope is not None and not isinstance(scope, dict):
            raise validate.bad("scope", "must be an object")
        page = self.store.events(
            after=validate.integer("after", a.get("after")),
            tail=validate.integer("tail", a.get("tail")),
            limit=validate.integer("limit", a.get("limit"), minimum=1, maximum=256) or 64,
            scope=scope,
        )
        return {"events": [e.to_dict() for e in page.events], "next_cursor": page.next_cursor, "latest": page.latest}

    async def head(self, call: Call) -> dict[str, Any]:
        seq, digest = self.store.head()
        return {"seq": seq, "hash": digest}

    async def verify(self, call: Call) -> dict[str, Any]:
        a = call.args
        result = await asyncio.to_thread(
            self.store.verify,
            from_seq=validate.integer("from", a.get("from")),
            anchor=validate.optional_text("anchor", a.get("anchor"), max_len=128),
        )
        return dict(result.to_dict())


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    config.paths.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store.open(
        config.paths.state_dir / "journal.sqlite",
        operation_retention=config.journal.operation_retention,
        operation_capacity=config.journal.operation_capacity,
    )
    journal = Journal(config, store)
    s = config.services
    door = Door(
        "journal",
        allow=AllowList.of([s.intake_user, s.approval_user, s.runner_user], []),
        verbs={
            "append": journal.append,
            "op.begin": journal.op_begin,
            "op.complete": journal.op_complete,
            "op.abandon": journal.op_abandon,
            "request.claim": journal.request_claim,
            "events": journal.events,
            "head": journal.head,
            "verify": journal.verify,
        },
        max_line=config.limits.max_request_bytes * 2,
    )
    service = Service(NAME, config, [door])

    async def started() -> None:
        await store.append(writer="journal", kind="service.started", payload={"pid": os.getpid(), "version": __version__})

    async def stop() -> None:
        try:
            await store.append(writer="journal", kind="service.stopping", payload={"pid": os.getpid()})
        finally:
            await store.close()

    service.on_started = started
    service.on_stop = stop
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)
