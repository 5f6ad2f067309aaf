"""airlock-journal: the one writer of the audit store.

It serves ``internal/journal.sock`` to the other services.  The writer of an
event is taken from the connection's SO_PEERCRED, never from the message:
a uid that belongs to one service can only write as that service.  (Under
`airlock dev up` every service runs as the same user; then the uid maps to
several services and the message's ``writer`` picks among exactly those.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final

from airlock import __version__
from airlock.common import checkpoint, daemon, log, sshsig, validate
from airlock.common.codec import iso_utc
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.kinds import NOTICES
from airlock.common.peer import AllowList, Peer, uid_of
from airlock.common.server import Call, Door, Service
from airlock.journal import anchors, journalfiles, memory
from airlock.journal.chain import Anchor, AnchorCheck, parse_anchor
from airlock.journal.quota import JournalQuota
from airlock.journal.store import Store

# Anchors one verify call may carry (the CLI sends more in several calls).
MAX_ANCHORS_PER_CALL: Final = 4096

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


def grant_records(database: Path, limit: int = 4096) -> list[dict[str, Any]]:
    """The newest grant records (made, revoked, expired; issue 18), oldest first: approval rebuilds its grants from
    them.

    Like `latest_hold`: a read-only connection of its own, approval's own records only.
    """
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute(
            "SELECT seq, payload FROM events"
            " WHERE kind = 'operator.action' AND writer IN ('approval', 'operator')"
            " AND json_extract(payload, '$.action') IN ('grant', 'grant.revoke', 'grant.expired', 'grant.exhausted')"
            " ORDER BY seq DESC LIMIT ?",
            (limit,),
        ).fetchall()
        out = []
        for seq, payload in reversed(rows):
            record = json.loads(payload)
            out.append(
                {
                    "seq": seq,
                    "action": record.get("action"),
                    "grant_id": record.get("grant_id"),
                    "grant": record.get("grant"),
                }
            )
        out += _grant_uses(conn, out)
    finally:
        conn.close()
    return sorted(out, key=lambda r: int(r["seq"]))


def _grant_uses(conn: sqlite3.Connection, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 34: each use of a grant with a number of uses (approval's ``approval.decided`` by that grant),
    as ``grant.used`` records, so a restart gives no use back.  Only grants still live, read from the
    first of them on (seq is the key: no scan of what came before)."""
    ended = {r["grant_id"] for r in records if r["action"] != "grant"}
    limited = {
        str(r["grant"]["grant_id"]): int(r["seq"])
        for r in records
        if r["action"] == "grant"
        and isinstance(r.get("grant"), dict)
        and r["grant"].get("uses") is not None
        and r["grant"].get("grant_id") not in ended
    }
    if not limited:
        return []
    rows = conn.execute(
        "SELECT seq, json_extract(payload, '$.grant_id') FROM events"
        " WHERE seq > ? AND kind = 'approval.decided' AND writer = 'approval'"
        " AND json_extract(payload, '$.by') = 'grant'",
        (min(limited.values()),),
    ).fetchall()
    return [
        {"seq": seq, "action": "grant.used", "grant_id": grant_id, "grant": None}
        for seq, grant_id in rows
        if grant_id in limited and seq > limited[grant_id]
    ]


class Journal:
    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self.database = config.paths.state_dir / "journal.sqlite"
        self.writers = writers_by_uid(config)
        # Each agent's share of the journal's bytes: charged for every record, checked at op.begin.
        self.quota = JournalQuota(
            config.journal.agent_bytes_per_second, config.journal.agent_burst_bytes, time.monotonic
        )
        store.meter = self.quota.charge

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
        after = self.store.parse_marks(a.get("after"))
        if not validate.boolean("durable", a.get("durable"), True):
            # Queued, answered at once: durable with the next durable commit that names its mark.
            mark = self.store.append_deferred(**fields, claim=claim, after=after)
            return None if mark is None else {"seq": None, "mark": mark}
        if claim is None:
            event = await self.store.append(**fields, after=after)
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
        # A new request of an agent over its journal quota, or one the full replay store has no room
        # for, is refused before anything of it is written.
        uid = event.get("peer_uid") if isinstance(event, dict) else None
        self._admit(uid if isinstance(uid, int) and not isinstance(uid, bool) else None)
        self.store.op_room(operation_id)
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

    def _admit(self, uid: int | None) -> None:
        """The agent's journal quota; the first refusal of a spell is logged for the operator."""
        try:
            self.quota.admit(uid)
        except AirlockError as exc:
            if self.quota.newly_limited:
                log.get().warning(
                    "journal.quota.exceeded",
                    peer_uid=uid,
                    retry_after_seconds=exc.details.get("retry_after_seconds"),
                    bytes_per_second=self.quota.rate,
                    burst_bytes=self.quota.burst,
                )
            raise

    async def op_complete(self, call: Call) -> dict[str, Any]:
        self.writer_for(call.peer, "intake")
        a = call.args
        outcome = a.get("outcome")
        if not isinstance(outcome, dict):
            raise validate.bad("outcome", "must be an object")
        # Submitted together, the outcome and the event land in one group commit.
        # The event's `after` marks (the runner's deferred end record) hold for the outcome too.
        event = a.get("event")
        after = self.store.parse_marks(event.get("after")) if isinstance(event, dict) else ()
        out: dict[str, Any]
        _, out = await asyncio.gather(
            self.store.op_complete(
                validate.text("operation_id", a.get("operation_id"), max_len=256, allow_empty=False),
                validate.text("digest", a.get("digest"), max_len=128, allow_empty=False),
                outcome,
                after,
            ),
            self._event(call.peer, a.get("event")),
        )
        return out

    async def op_abandon(self, call: Call) -> dict[str, Any]:
        self.writer_for(call.peer, "intake")
        await self.store.op_abandon(validate.text("operation_id", call.args.get("operation_id"), max_len=256))
        return await self._event(call.peer, call.args.get("event"))

    async def request_claim(self, call: Call) -> dict[str, Any]:
        """Intake's replay guard: claim a request ID for the replay window, durably.

        A claim (a control action's: ping or hello with a time) is a row too: charged to the agent's
        journal quota like a record, and refused when the agent is over it."""
        self.writer_for(call.peer, "intake")
        key, window = self._claim_args(call.args)
        uid, colon, _ = key.partition(":")
        if colon and uid.isdigit() and len(uid) <= 10:
            self._admit(int(uid))
            self.quota.charge(int(uid), len(key))
        return {"claimed": await self.store.claim_request_id(key, window)}

    @staticmethod
    def _claim_args(a: Any) -> tuple[str, float]:
        if not isinstance(a, dict):
            raise validate.bad("claim", "must be an object")
        window = a.get("window_seconds")
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise validate.bad("window_seconds", "must be a number")
        return validate.text("key", a.get("key"), max_len=512, allow_empty=False), float(window)

    async def sync(self, call: Call) -> dict[str, Any]:
        """Which of the caller's deferred marks are not durable (failed, or of an earlier journal process)."""
        self.writer_for(call.peer, call.args.get("writer"))
        return {"lost": await self.store.sync(call.args.get("marks"))}

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

    async def grants_state(self, call: Call) -> dict[str, Any]:
        """approval, at start: the grant records, to restore the live grants from."""
        if self.writer_for(call.peer, "approval") != "approval":
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        try:
            records = await asyncio.to_thread(grant_records, self.database)
        except (sqlite3.Error, ValueError) as exc:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, f"the journal could not be read: {exc}") from None
        return {"records": records}

    async def head(self, call: Call) -> dict[str, Any]:
        seq, digest = self.store.head()
        return {"seq": seq, "hash": digest}

    async def verify(self, call: Call) -> dict[str, Any]:
        """The chain, and the database against anchors: those given and (``own_anchors``) the journal's file."""
        a = call.args
        given = _anchor_args(a.get("anchors"))
        own = validate.boolean("own_anchors", a.get("own_anchors"), False)
        if own:
            found, unreadable = await asyncio.to_thread(anchors.read_file, anchors.path_beside(self.store.path))
            given += found
        result = await asyncio.to_thread(
            self.store.audit,
            given,
            from_seq=validate.integer("from", a.get("from")),
            anchor=validate.optional_text("anchor", a.get("anchor"), max_len=128),
            check_chain=validate.boolean("chain", a.get("chain"), True),
        )
        if own:
            result["anchors"] |= {"file": str(anchors.path_beside(self.store.path)), "unreadable": unreadable}
        # Whether this journal's anchors also go to journald (it runs under systemd).
        target = self.config.log.target
        result["anchors_in_journald"] = target == "journal" or (target == "auto" and log.stderr_is_journal(os.environ))
        return result


def _anchor_args(value: Any) -> list[Anchor]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_ANCHORS_PER_CALL:
        raise validate.bad("anchors", f"must be a list of at most {MAX_ANCHORS_PER_CALL} anchors")
    try:
        return [parse_anchor(item) for item in value]
    except ValueError as exc:
        raise validate.bad("anchors", str(exc)) from None


class Anchoring:
    """Writes the chain head outside the database: at start, at stop, every N records and every T seconds.

    Each anchor is a signed checkpoint (issue 29) when the host's checkpoint key
    is there: the head, this host's identity, the time and the previous anchor,
    signed with ``ssh-keygen -Y sign`` (`airlock.common.checkpoint`).  Signing
    runs here, in the anchoring task, never on a request's path: at most one
    at a time (the lock) and bounded (`sshsig.RUN_SECONDS`); an anchor whose
    signature fails is written unsigned and says why in the log.

    File first (fsynced), then journald through the structured logger.  Never
    while the journal refuses to serve: that would vouch for a bad head.
    """

    def __init__(
        self,
        store: Store,
        path: Path,
        every_records: int,
        every_seconds: float,
        *,
        key: Path | None = None,
        identity: str | None = None,
    ) -> None:
        self.store = store
        self.path = path
        self.every_records = every_records
        self.every_seconds = every_seconds
        self.last: tuple[int, str] | None = None
        self.host: str | None = None  # AIRLOCK_HOST on its journald entries, when records go there too
        self.key = key  # the checkpoint key; None: anchors are not signed
        self.identity = identity  # this host's <hostname>/<machine-id>, which checkpoints name
        self.signed = 0
        self.sign_seconds = 0.0  # time spent signing, for `airlock` benchmarks (docs/benchmarks.md)
        self.log = log.get()
        self._lock = asyncio.Lock()
        self._pending: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None

    def write(self, reason: str, head: tuple[int, str] | None = None, signed: dict[str, Any] | None = None) -> None:
        """Anchor ``head`` (default: the current head) now (blocking: file append and fsync)."""
        seq, digest = head if head is not None else self.store.head()
        if seq == 0 or self.store.refusal is not None or self.last == (seq, digest):
            return
        anchor = Anchor(seq, digest)
        when = time.time()
        try:
            anchors.append(self.path, anchor, reason, when, extra=signed)
        except OSError as exc:
            self.log.error("journal.anchor.failed", path=str(self.path), error=str(exc))
        self.last = (seq, digest)
        self.log.info(
            "journal.chain.anchored", **anchors.journald_fields(anchor, reason), host=self.host, **(signed or {})
        )

    async def _sign(self, seq: int, digest: str) -> dict[str, Any] | None:
        """The signed checkpoint of this head (``checkpoint``: the statement, ``signature``), or None."""
        if self.key is None or self.identity is None:
            return None
        if self.last is None:
            previous = await asyncio.to_thread(anchors.last_in_file, self.path)
            if previous is not None:
                self.last = (previous.seq, previous.hash)
        prev = self.last if self.last is not None and self.last[0] <= seq else None
        try:
            made = checkpoint.Checkpoint(self.identity, seq, digest, iso_utc(time.time()), prev)
            started = time.perf_counter()
            signature = await sshsig.sign(self.key, checkpoint.NAMESPACE, made.statement())
            self.sign_seconds += time.perf_counter() - started
        except (sshsig.SigningError, ValueError) as exc:
            self.log.error(
                "journal.checkpoint.unsigned",
                message_id=NOTICES["journal.checkpoint.unsigned"],
                chain_seq=seq,
                key=str(self.key),
                error=str(exc),
            )
            return None
        self.signed += 1
        return {"checkpoint": made.statement().decode(), "signature": signature}

    async def anchor(self, reason: str) -> None:
        async with self._lock:
            seq, digest = self.store.head()
            if seq == 0 or self.store.refusal is not None or self.last == (seq, digest):
                return
            signed = await self._sign(seq, digest)
            await asyncio.to_thread(self.write, reason, (seq, digest), signed)

    def committed(self) -> None:
        """After each commit: anchor once ``every_records`` records have gone by."""
        if self.every_records <= 0 or self._pending is not None:
            return
        seq = self.store.head()[0]
        if seq - (self.last[0] if self.last else 0) >= self.every_records:
            self._pending = asyncio.get_running_loop().create_task(self._records())

    async def _records(self) -> None:
        try:
            await self.anchor("records")
            await asyncio.to_thread(self.tend_memory)
        finally:
            self._pending = None

    def tend_memory(self) -> None:
        """Every ``every_records`` records: SQLite's figures to the log, the C heap's free pages back to the kernel."""
        before = memory.rss_kib()
        trimmed = memory.trim()
        after = memory.rss_kib()
        self.log.info(
            "journal.memory.sampled",
            trimmed=trimmed,
            rss_kib=after.get("VmRSS"),
            anon_kib=after.get("RssAnon"),
            released_kib=before.get("RssAnon", 0) - after.get("RssAnon", 0),
            **{f"sqlite_{k}": v for k, v in memory.sqlite_status().items()},
        )

    def start(self) -> None:
        if self.every_seconds > 0:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.every_seconds)
            await self.anchor("seconds")

    async def stop(self) -> None:
        for task in (self._ticker, self._pending):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass


def check_at_start(store: Store, path: Path) -> None:
    """Re-created triggers are reported; a chain that does not match its newest anchor is refused."""
    logger = log.get()
    for name in store.restored_triggers:
        logger.warning(
            "journal.trigger.restored",
            message_id=NOTICES["journal.trigger.restored"],
            trigger=name,
            database=str(store.path),
        )
    last = None
    try:
        last = anchors.last_in_file(path)
        result = store.check_tail(last)
    except (OSError, sqlite3.Error) as exc:  # cannot check: fail closed all the same
        result = AnchorCheck(False, 0, 0, None, f"cannot check the chain against {path}: {exc}")
    if result.ok:
        return
    store.refuse(
        f"the audit journal does not match its anchors (first bad seq {result.first_bad_seq}: {result.reason}); "
        "nothing runs until an operator acknowledges it: see `airlock audit verify`"
    )
    logger.error(
        "journal.chain.mismatched",
        message_id=NOTICES["journal.chain.mismatched"],
        first_bad_seq=result.first_bad_seq,
        reason=result.reason,
        anchor_seq=last.seq if last else None,
        anchor_hash=last.hash if last else None,
        head_seq=store.head()[0],
        head_hash=store.head()[1],
        database=str(store.path),
        anchors=str(path),
    )


def shipping() -> tuple[Callable[[list[Any]], None] | None, str | None]:
    """Every committed record to journald, complete (journal/fleet.py), when this journal logs there;
    and the host identity its anchors carry too."""
    if not log.to_journald():
        return None, None
    logger = log.get()
    try:
        send = journalfiles.RecordSender(journalfiles.local_host())
    except (ImportError, OSError, ValueError) as exc:
        logger.error("journal.record.unshipped", message_id=NOTICES["journal.record.unshipped"], error=str(exc))
        return None, None

    def ship(events: list[Any]) -> None:
        # Called inside the commit, before its callers hear back: whatever journald does,
        # the commit completes.  The database has the records; a collector will show the gap.
        try:
            send(events)
        except Exception as exc:
            with contextlib.suppress(Exception):  # the log goes to the same journald
                logger.error(
                    "journal.record.unshipped",
                    message_id=NOTICES["journal.record.unshipped"],
                    first_seq=events[0].seq if events else None,
                    count=len(events),
                    error=str(exc),
                )

    return ship, send.host


def _identity() -> str | None:
    """This host's ``<hostname>/<machine-id>``, which its checkpoints name; None without a machine ID."""
    try:
        return journalfiles.local_host()
    except (OSError, ValueError) as exc:
        log.get().error(
            "journal.checkpoint.unsigned", message_id=NOTICES["journal.checkpoint.unsigned"], error=str(exc)
        )
        return None


def _refusing(
    store: Store, verb: Callable[[Call], Awaitable[dict[str, Any]]]
) -> Callable[[Call], Awaitable[dict[str, Any]]]:
    async def guarded(call: Call) -> dict[str, Any]:
        if store.refusal is not None:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, store.refusal)
        return await verb(call)

    return guarded


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    config.paths.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store.open(
        config.paths.state_dir / "journal.sqlite",
        operation_retention=config.journal.operation_retention,
        operation_capacity=config.journal.operation_capacity,
        operation_capacity_per_agent=config.journal.operation_capacity_per_agent,
    )
    journal = Journal(config, store)
    anchor_path = anchors.path_beside(store.path)
    await asyncio.to_thread(check_at_start, store, anchor_path)
    anchoring = Anchoring(
        store,
        anchor_path,
        config.journal.anchor_every_records,
        config.journal.anchor_every_seconds,
        key=config.journal.checkpoint_key,
        identity=_identity(),
    )
    store.on_commit = anchoring.committed
    store.on_records, anchoring.host = shipping()
    s = config.services
    door = Door(
        "journal",
        allow=AllowList.of([s.intake_user, s.approval_user, s.runner_user], []),
        verbs={
            # While the chain does not match its anchors, only verify answers.
            "append": _refusing(store, journal.append),
            "op.begin": _refusing(store, journal.op_begin),
            "op.complete": _refusing(store, journal.op_complete),
            "op.abandon": _refusing(store, journal.op_abandon),
            "request.claim": _refusing(store, journal.request_claim),
            "sync": _refusing(store, journal.sync),
            "events": _refusing(store, journal.events),
            "head": _refusing(store, journal.head),
            "hold.state": _refusing(store, journal.hold_state),
            "grants.state": _refusing(store, journal.grants_state),
            "verify": journal.verify,
        },
        max_line=config.limits.max_request_bytes * 2,
    )
    service = Service(NAME, config, [door])

    async def started() -> None:
        if store.refusal is not None:
            return
        payload: dict[str, Any] = {"pid": os.getpid(), "version": __version__}
        if store.restored_triggers:
            payload["restored_triggers"] = list(store.restored_triggers)
        await store.append(writer="journal", kind="service.started", payload=payload)
        await anchoring.anchor("start")
        anchoring.start()

    async def stop() -> None:
        await anchoring.stop()
        try:
            if store.refusal is None:
                await store.append(writer="journal", kind="service.stopping", payload={"pid": os.getpid()})
        finally:
            await store.close()
            await anchoring.anchor("stop")

    service.on_started = started
    service.on_stop = stop
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)
