"""airlock-journal: the one writer of the audit store.

It serves ``internal/journal.sock`` to the other services.  The writer of an
event is taken from the connection's SO_PEERCRED, never from the message:
a uid that belongs to one service can only write as that service.  (Under
`airlock dev up` every service runs as the same user; then the uid maps to
several services and the message's ``writer`` picks among exactly those.)
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
from collections.abc import Mapping
from pathlib import Path
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


def latest_hold(database: Path) -> dict[str, Any] | None:
    """The newest `hold` or `release` operator action in the journal, or None.

    Read on a read-only connection of its own (the store's writer is not
    involved); only approval's own records count, so nothing an agent can
    put in an ID or a session can stand in for one.
    """
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute(
            "SELECT seq, time, peer_uid, payload FROM events"
            " WHERE kind = 'operator.action' AND writer IN ('approval', 'operator')"
            " AND json_extract(payload, '$.action') IN ('hold', 'release')"
            " ORDER BY seq DESC LIMIT 1"
        ).fetchone()
    finally:
        conn.close()
    if row is None:
        return None
    payload = json.loads(row[3])
    return {
        "seq": row[0],
        "time": row[1],
        "peer_uid": row[2],
        "action": payload.get("action"),
        "operator": payload.get("operator"),
        "reason": payload.get("reason"),
        "since": payload.get("since"),
    }


class Journal:
    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self.database = config.paths.state_dir / "journal.sqlite"
        self.writers = writers_by_uid(config)

    def writer_for(self, peer: Peer, claimed: Any) -> str:
        allowed = self.writers.get(peer.uid, set())
        if len(allowed) == 1:
            return next(iter(allowed))
        if isinstance(claimed, str) and claimed in allowed:
            return claimed
        raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")

    async def append(self, call: Call) -> dict[str, Any]:
        appended = await self._append(call.peer, call.args)
        assert appended is not None
        return appended

    async def _append(
        self, peer: Peer, a: dict[str, Any], claim: tuple[str, float] | None = None
    ) -> dict[str, Any] | None:
        """Append one event; with ``claim`` only if the request ID wins it (None otherwise), in one commit."""
        payload = a.get("payload") or {}
        if not isinstance(payload, dict):
            raise validate.bad("payload", "must be an object")
        fields: dict[str, Any] = {
            "writer": self.writer_for(peer, a.get("writer")),
            "kind": validate.text("kind", a.get("kind"), max_len=64),
            "request_id": validate.optional_text("request_id", a.get("request_id"), max_len=256),
            "operation_id": validate.optional_text("operation_id", a.get("operation_id"), max_len=256),
            "peer_uid": validate.integer("peer_uid", a.get("peer_uid")),
            "session": validate.optional_text("session", a.get("session"), max_len=256),
            "payload": payload,
        }
        if claim is None:
            event = await self.store.append(**fields)
        else:
            found = await self.store.append_claimed(claim[0], claim[1], **fields)
            if found is None:
                return None
            event = found
        return {"seq": event.seq, "hash": event.hash}

    async def _event(self, peer: Peer, event: Any) -> dict[str, Any]:
        """Append the event a combined verb carries (one round trip less per request)."""
        if event is None:
            return {}
        if not isinstance(event, dict):
            raise validate.bad("event", "must be an object")
        appended = await self._append(peer, event)
        assert appended is not None
        return {"event": appended}

    async def op_begin(self, call: Call) -> dict[str, Any]:
        """Claim the request ID (optional), journal the event (optional), then begin the operation."""
        self.writer_for(call.peer, "intake")
        a = call.args
        operation_id = validate.text("operation_id", a.get("operation_id"), max_len=256, allow_empty=False)
        digest = validate.text("digest", a.get("digest"), max_len=128, allow_empty=False)
        has_protected = validate.boolean("has_protected", a.get("has_protected"), False)
        claim = a.get("claim")
        event = a.get("event")
        if claim is not None:
            key, window = self._claim_args(claim)
            if isinstance(event, dict):
                # The replay gate and request.received in one transaction: one commit.
                appended = await self._append(call.peer, event, (key, window))
                if appended is None:
                    return {"claimed": False}
                out: dict[str, Any] = {"event": appended}
            else:
                if not await self.store.claim_request_id(key, window):
                    return {"claimed": False}
                out = await self._event(call.peer, event)
        else:
            out = await self._event(call.peer, event)
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
        return {"claimed": await self.store.claim_request_id(*self._claim_args(a))}

    @staticmethod
    def _claim_args(a: Any) -> tuple[str, float]:
        if not isinstance(a, dict):
            raise validate.bad("claim", "must be an object")
        window = a.get("window_seconds")
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise validate.bad("window_seconds", "must be a number")
        return validate.text("key", a.get("key"), max_len=512, allow_empty=False), float(window)

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

    async def hold_state(self, call: Call) -> dict[str, Any]:
        """approval, at start: the newest hold/release, to restore the hold from."""
        if self.writer_for(call.peer, "approval") != "approval":
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        try:
            latest = await asyncio.to_thread(latest_hold, self.database)
        except (sqlite3.Error, ValueError) as exc:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, f"the journal could not be read: {exc}") from None
        return {"latest": latest}

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
            "hold.state": journal.hold_state,
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
