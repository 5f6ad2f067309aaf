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
from airlock.journal import anchors, chain, journalfiles, memory, retention, segments
from airlock.journal.chain import Anchor, AnchorCheck, parse_anchor
from airlock.journal.disk import DiskWatch
from airlock.journal.quota import JournalQuota
from airlock.journal.reads import VERIFIED_KIND
from airlock.journal.store import Store

# Anchors one verify call may carry (the CLI sends more in several calls).
MAX_ANCHORS_PER_CALL: Final = 4096
# Retention (journal/retention.py) runs after every rollover, at start and this often.
RETENTION_EVERY_SECONDS: Final = 3600.0

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
    put in an ID or a session can stand in for one.  After a rollover the
    live segment's opening record carries the newest one of the segments
    before it (journal/segments.py `carried`).
    """
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        return segments.latest_hold(conn)
    finally:
        conn.close()


def grant_records(database: Path, limit: int = 4096) -> list[dict[str, Any]]:
    """The newest grant records (made, revoked, expired; issue 18), oldest first: approval rebuilds its grants from
    them.

    Like `latest_hold`: a read-only connection of its own, approval's own records only; the grants still in
    force when the segments before were sealed come first, from the live segment's opening record.
    """
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        out = segments.grant_records(conn, limit)
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
        self._retaining = asyncio.Lock()
        self.anchoring: Anchoring | None = None  # set by `build`: a verified point is anchored at once
        self.disk_watch: DiskWatch | None = None  # set by `build`

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

    async def disk(self, call: Call) -> dict[str, Any]:
        """The journal's size, its filesystem's free space and growth rate (`airlock status`)."""
        watch = self.disk_watch
        if watch is None:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the disk watch is not running")
        try:
            found = await watch.check()
        except OSError as exc:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, f"cannot measure the journal's filesystem: {exc}") from None
        return found.to_dict()

    async def head(self, call: Call) -> dict[str, Any]:
        seq, digest = self.store.head()
        return {"seq": seq, "hash": digest}

    def limits(self) -> retention.Limits:
        j = self.config.journal
        return retention.Limits(
            j.retention_max_age, j.retention_max_bytes, j.archive_max_age, j.archive_max_bytes, j.archive_delete_when
        )

    async def retain(self, *, confirmed: bool = False, dry_run: bool = False) -> dict[str, Any]:
        """Apply the retention rules (journal/retention.py) once; one run at a time."""

        async def journal_deletion(payload: dict[str, Any]) -> None:
            await self.store.append(writer="journal", kind="segment.deleted", payload=payload)

        async with self._retaining:
            assert self.store.archive_dir is not None
            report = await retention.apply(
                self.store.path,
                self.store.archive_dir,
                self.limits(),
                time.time(),
                journal_deletion,
                confirmed=confirmed,
                dry_run=dry_run,
            )
        logger = log.get()
        for item in report["archived"]:
            logger.info("journal.segment.archived", segment=item["segment"], file=item["file"], to=item["to"])
        for item in report["deleted"]:
            logger.warning(
                "journal.segment.deleted", segment=item["segment"], last_seq=item["last_seq"], reason=item["reason"]
            )
        if report["kept"] and not dry_run:
            logger.warning(
                "journal.archive.over_limit",
                segments=len(report["kept"]),
                bytes=sum(int(k["bytes"]) for k in report["kept"]),
                why=report["kept"][0]["why"],
            )
        return report

    async def archive(self, call: Call) -> dict[str, Any]:
        """``airlock audit archive``: the sealed segments, the archive, and (``confirm``) deleting what is
        past the archive's limits; ``shipped`` "SEQ:HASH" records what a collector holds (checked here)."""
        a = call.args
        confirm = validate.boolean("confirm", a.get("confirm"), False)
        shipped = validate.optional_text("shipped", a.get("shipped"), max_len=128)
        if shipped is not None:
            seq_text, _, digest = shipped.partition(":")
            if not seq_text.isdigit() or len(seq_text) > 18 or not chain.is_hash(digest):
                raise validate.bad("shipped", "must be SEQ:HASH (a seq and its 64-hex-digit hash)")
            seq = int(seq_text)
            held = await asyncio.to_thread(self.store.hash_at, seq)
            if held != digest:
                raise AirlockError(
                    ErrorCode.INVALID_ARGUMENTS,
                    f"record {seq} here has another hash (or is not here): the collector does not hold this chain",
                    {"field": "shipped"},
                )
            await asyncio.to_thread(retention.write_shipped, self.store.path, seq, digest)
        if confirm and self.config.journal.archive_delete_when != "confirmed":
            raise validate.bad("confirm", "journal.archive_delete_when is not 'confirmed'")
        report = await self.retain(confirmed=confirm, dry_run=not confirm and shipped is None)
        sealed = await asyncio.to_thread(self.store.sealed)
        live_dir = segments.segments_dir(self.store.path)
        return report | {
            "segments": [s.to_dict() for s in sealed if s.path.parent == live_dir],
            "archive": [s.to_dict() for s in sealed if s.path.parent != live_dir],
            "archive_dir": str(self.store.archive_dir),
            "shipped": retention.read_shipped(self.store.path),
        }

    async def verify(self, call: Call) -> dict[str, Any]:
        """The chain, and the database against anchors: those given and (``own_anchors``) the journal's file.

        ``full``: also every sealed segment, each on its own and linked into one chain (journal/segments.py).
        """
        a = call.args
        result = await self._verify(a)
        if validate.boolean("full", a.get("full"), False):
            full = await asyncio.to_thread(self.store.verify_full)
            result["full"] = full
            if not full["ok"]:
                result |= {"ok": False, "first_bad_seq": full["first_bad_seq"], "reason": full["reason"]}
        return result

    async def _verify(self, a: dict[str, Any]) -> dict[str, Any]:
        given = _anchor_args(a.get("anchors"))
        own = validate.boolean("own_anchors", a.get("own_anchors"), False)
        if own:
            found, unreadable = await asyncio.to_thread(anchors.read_file, anchors.path_beside(self.store.path))
            given += found
        check_chain = validate.boolean("chain", a.get("chain"), True)
        result = await asyncio.to_thread(
            self.store.audit,
            given,
            from_seq=validate.integer("from", a.get("from")),
            anchor=validate.optional_text("anchor", a.get("anchor"), max_len=128),
            check_chain=check_chain,
            incremental=not validate.boolean("full", a.get("full"), False),
        )
        if check_chain and result["ok"]:
            result["recorded"] = await self._record_verified(result)
        if own:
            result["anchors"] |= {"file": str(anchors.path_beside(self.store.path)), "unreadable": unreadable}
        # Whether this journal's anchors also go to journald (it runs under systemd).
        target = self.config.log.target
        result["anchors_in_journald"] = target == "journal" or (target == "auto" and log.stderr_is_journal(os.environ))
        return result

    async def _record_verified(self, result: dict[str, Any]) -> dict[str, Any] | None:
        """After a walk that checked out to the head: a `reads.VERIFIED_KIND` record naming that head, anchored
        at once (the next verify starts there), or None when there is nothing new to record."""
        walked = result.get("chain") or {}
        seq, digest = walked.get("head_seq"), walked.get("head_hash")
        point = result.get("verified") or {}
        if self.store.refusal is not None or not seq or seq != result.get("head_seq"):
            return None
        if result.get("mode") not in ("full", "incremental"):
            return None  # a walk from --from vouches for its part only: it is no start point for the next
        if point.get("record_seq") == seq:
            return None  # nothing since the last verified point but its own record
        event = await self.store.append(
            writer="journal",
            kind=VERIFIED_KIND,
            payload={
                "seq": seq,
                "hash": digest,
                "checked": walked.get("checked"),
                "mode": result.get("mode"),
                "from_seq": point.get("seq", 1),
            },
        )
        if self.anchoring is not None:
            await self.anchoring.anchor_at("verified", (event.seq, event.hash))
        return {"seq": event.seq, "hash": event.hash}


async def _logged(work: Awaitable[Any]) -> None:
    """Background work: an error is logged, never raised into the event loop."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.get().error("journal.background.failed", error=str(exc)[:300])


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

    async def anchor_at(self, reason: str, head: tuple[int, str]) -> None:
        """Anchor one given record (a ``chain.verified`` record: it must be anchored itself, not a later head)."""
        async with self._lock:
            if self.store.refusal is not None:
                return
            signed = await self._sign(*head)
            await asyncio.to_thread(self.write, reason, head, signed)

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
        segment_max_bytes=config.journal.segment_max_bytes,
        segment_max_age=config.journal.segment_max_age,
    )
    store.archive_dir = config.journal.archive_dir or segments.default_archive_dir(store.path)
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
    background: set[asyncio.Task[Any]] = set()

    def spawn(work: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(_logged(work))
        background.add(task)
        task.add_done_callback(background.discard)

    def rolled(events: list[Any]) -> None:
        # The seal and the opening are anchored (and signed) at once; then retention runs.
        log.get().info("journal.segment.sealed", segment=events[0].payload.get("segment"), last_seq=events[0].seq)
        spawn(anchoring.anchor("rollover"))
        spawn(journal.retain())

    store.on_rollover = rolled
    journal.anchoring = anchoring
    j = config.journal
    journal.disk_watch = watch = DiskWatch(
        store.path,
        warn_percent=j.disk_warn_percent,
        warn_bytes=j.disk_warn_bytes,
        every=j.disk_check_seconds,
        repeat=j.disk_warn_every_seconds,
    )
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
            "archive": _refusing(store, journal.archive),
            "disk": journal.disk,
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
        watch.start()

        async def hourly() -> None:
            while True:
                await _logged(journal.retain())
                await asyncio.sleep(RETENTION_EVERY_SECONDS)

        spawn(hourly())

    async def stop() -> None:
        for task in list(background):
            task.cancel()
        await watch.stop()
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
