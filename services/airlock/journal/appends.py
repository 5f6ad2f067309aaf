"""The store's write verbs: what callers queue for the group-commit writer.

`append` (durable), `append_claimed` (a request-ID claim and its record in one
transaction), `append_deferred` (queued without waiting; answers a mark),
`parse_marks` and `sync` (what became of earlier marks), settled operations
(`op_begin`, `op_complete`, `op_abandon`) and request-ID claims.  Each checks
its input, builds one work item and hands it to `Writer._submit`
(journal/writer.py).  `Appends` is one part `Store` holds (journal/store.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.kinds import check_writer
from airlock.journal.operations import MAX_ID_CHARS, OpBegin, Settled, check_id
from airlock.journal.reads import Reader
from airlock.journal.records import (
    MAX_OUTCOME_BYTES,
    MAX_PAGE,
    MAX_PAYLOAD_BYTES,
    Event,
    _canonical_object,
    _invalid,
    _optional_text,
    _optional_uid,
)
from airlock.journal.workitems import _Append, _Claim, _lost, _Settle, _Sync
from airlock.journal.writer import Writer

# A replay window longer than a day is a misconfiguration, not a policy.
MAX_CLAIM_WINDOW: Final = 86400.0
MAX_AFTER: Final = 16  # marks one append may name
# Claim keys are "<uid>:<request id>": the uid's digits, a colon, an ID.
MAX_CLAIM_KEY_CHARS: Final = MAX_ID_CHARS + 16


class Appends:
    """`Store`'s write verbs: each checks its input and hands one work item to ``writer`` (the queue and the
    transaction are `Writer`'s); a claim's pre-check reads through ``reader``'s connection."""

    def __init__(self, writer: Writer, reader: Reader) -> None:
        self.writer = writer
        self.reader = reader
        # Called with (peer_uid, payload bytes) for every record taken (journal/quota.py charges the agent).
        self.meter: Callable[[int | None, int], None] | None = None

    # -- appending ------------------------------------------------------------

    async def append(
        self,
        *,
        writer: str,
        kind: str,
        request_id: str | None = None,
        operation_id: str | None = None,
        peer_uid: int | None = None,
        session: str | None = None,
        payload: dict[str, Any],
        after: tuple[int, ...] = (),
    ) -> Event:
        """Append one event; return it once its commit is durable.

        ``writer`` is the service the journal service identified by the peer's
        credentials.  The payload must not hold protected values (callers
        strip them); it is capped at `MAX_PAYLOAD_BYTES` of canonical JSON.
        ``after``: marks (from `parse_marks`) that must be committed with or
        before it, else it fails with ``audit_unavailable``.
        """
        item = self._append_item(writer, kind, request_id, operation_id, peer_uid, session, payload)
        item.after = after
        future = item.future
        assert future is not None
        self.writer.submit(item)
        event = await future
        assert event is not None  # only a claimed append can come back empty
        return event

    async def append_claimed(
        self,
        key: str,
        window_seconds: float,
        *,
        writer: str,
        kind: str,
        request_id: str | None = None,
        operation_id: str | None = None,
        peer_uid: int | None = None,
        session: str | None = None,
        payload: dict[str, Any],
    ) -> Event | None:
        """`claim_request_id` and `append` in one transaction: the event, or None if the key was held."""
        item = self._append_item(writer, kind, request_id, operation_id, peer_uid, session, payload)
        item.claim = self._claim_item(key, window_seconds)
        future = item.future
        assert future is not None
        self.writer.submit(item)
        return await future

    def append_deferred(
        self,
        *,
        writer: str,
        kind: str,
        request_id: str | None = None,
        operation_id: str | None = None,
        peer_uid: int | None = None,
        session: str | None = None,
        payload: dict[str, Any],
        claim: tuple[str, float] | None = None,
        after: tuple[int, ...] = (),
    ) -> str | None:
        """Queue one event without waiting for its commit; return its mark.

        It is durable once a later durable commit that names the mark in
        ``after`` has returned.  With ``claim`` (key, window) the request ID
        is claimed first, at once: None if it is held (by a committed claim
        or by one still queued), and nothing is queued.
        """
        item = self._append_item(writer, kind, request_id, operation_id, peer_uid, session, payload)
        item.future = None
        item.after = after  # checked like a durable append's: if one failed, this is not written (its mark fails)
        if claim is not None:
            item.claim = self._claim_item(*claim)
            if not self._claim_free(item.claim):
                return None
        self.writer.submit(item)
        if item.claim is not None:
            key = item.claim.key
            self.writer.claims_queued[key] = self.writer.claims_queued.get(key, 0) + 1
        return f"{self.writer.boot}:{item.mark}"

    def _claim_free(self, claim: _Claim) -> bool:
        """Whether ``claim`` would win now: no queued claim of its key, no unexpired committed one."""
        if claim.key in self.writer.claims_queued:
            return False
        with self.reader.lock:
            row = self.reader.conn.execute("SELECT expires FROM request_ids WHERE key = ?", (claim.key,)).fetchone()
        return row is None or float(row[0]) <= claim.now

    def parse_marks(self, marks: Any) -> tuple[int, ...]:
        """Marks as ``after`` takes them; a mark of another boot fails with ``audit_unavailable`` at once."""
        if marks is None:
            return ()
        if not isinstance(marks, list) or len(marks) > MAX_AFTER:
            raise _invalid(f"after must be a list of at most {MAX_AFTER} marks", "after")
        out = []
        for mark in marks:
            boot, _, number = mark.partition(":") if isinstance(mark, str) else ("", "", "")
            if not number.isdigit() or len(number) > 18 or not boot:
                raise _invalid("after: a mark is '<boot>:<number>'", "after")
            n = int(number)
            if boot != self.writer.boot or n > self.writer.issued or self.writer.mark_failed(n):
                raise _lost()
            out.append(n)
        return tuple(out)

    async def sync(self, marks: Any) -> list[str]:
        """The marks (of ``marks``) that are not durable: failed, or of another boot (their fate is unknown).

        Waits until everything queued before this call has been committed or failed.
        """
        if not isinstance(marks, list) or len(marks) > MAX_PAGE:
            raise _invalid(f"marks must be a list of at most {MAX_PAGE} marks", "marks")
        work = _Sync(asyncio.get_running_loop().create_future())
        self.writer.submit(work)
        await work.future
        lost = []
        for mark in marks:
            try:
                self.parse_marks([mark])
            except AirlockError as exc:
                if exc.code is not ErrorCode.AUDIT_UNAVAILABLE:
                    raise
                lost.append(mark)
        return lost

    def _append_item(
        self,
        writer: str,
        kind: str,
        request_id: str | None,
        operation_id: str | None,
        peer_uid: int | None,
        session: str | None,
        payload: dict[str, Any],
    ) -> _Append:
        check_writer(writer, kind)
        normalized, text = _canonical_object("payload", payload, MAX_PAYLOAD_BYTES)
        if self.meter is not None:  # the agent's share of the journal (journal/quota.py)
            self.meter(peer_uid, len(text))
        return _Append(
            time=iso_utc(self.writer.clock()),
            kind=kind,
            request_id=_optional_text("request_id", request_id),
            operation_id=_optional_text("operation_id", operation_id),
            peer_uid=_optional_uid(peer_uid),
            session=_optional_text("session", session),
            writer=writer,
            payload=normalized,
            payload_json=text,
            future=asyncio.get_running_loop().create_future(),
        )

    def refuse(self, reason: str) -> None:
        """Fail every later write closed with ``audit_unavailable`` (the chain did not check out)."""
        self.writer.refused = reason

    @property
    def refusal(self) -> str | None:
        return self.writer.refused

    # -- operations -----------------------------------------------------------

    async def op_begin(self, operation_id: str, digest: str, *, has_protected: bool = False) -> OpBegin:
        """new (now active) | replay (the settled outcome) | raise conflict / in progress /
        protected redelivery forbidden.  Active state is memory only (reference/001)."""
        return self.writer.ops.begin(operation_id, digest, has_protected=has_protected)

    def op_room(self, operation_id: str) -> None:
        """Raise ``busy`` now if ``op_begin`` of a new operation would (checked before anything is written)."""
        self.writer.ops.check_room(check_id("operation_id", operation_id))

    async def op_complete(
        self, operation_id: str, digest: str, outcome: dict[str, Any], after: tuple[int, ...] = ()
    ) -> None:
        """Store a settled outcome durably and end the operation's active state.

        Completing an operation that is not active (say, begun before a journal
        restart) still stores it.  Completing it again with the same digest is
        a no-op; with another digest it is a conflict.  If the store cannot
        commit, the active state is cleared anyway and `audit_unavailable`
        raised: the outcome is then unknown to replay, as after a crash.
        """
        _, text = _canonical_object("outcome", outcome, MAX_OUTCOME_BYTES)
        if not self.writer.ops.check_complete(operation_id, digest):
            self.writer.ops.abandon(operation_id)
            return
        entry = Settled(operation_id, digest, text, self.writer.clock())
        work = _Settle(entry, asyncio.get_running_loop().create_future(), after)
        try:
            self.writer.submit(work)
            await work.future
        except AirlockError:
            self.writer.ops.abandon(operation_id)
            raise

    async def op_abandon(self, operation_id: str) -> None:
        """End an operation that settled nothing (it never ran, or failed before settling)."""
        self.writer.ops.abandon(check_id("operation_id", operation_id))

    async def claim_request_id(self, key: str, window_seconds: float) -> bool:
        """Claim ``key`` for ``window_seconds``: True if it was free (or its claim
        expired), False if it is still claimed.

        The check and the insert are one statement in a durable transaction of
        the writer, so the answer holds across restarts of intake and of the
        journal.  If the store cannot commit, raises ``audit_unavailable``:
        the caller must fail closed.
        """
        work = self._claim_item(key, window_seconds)
        self.writer.submit(work)
        return await work.future

    def _claim_item(self, key: str, window_seconds: float) -> _Claim:
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_CLAIM_KEY_CHARS:
            raise _invalid(f"key must be a string of 1 to {MAX_CLAIM_KEY_CHARS} characters", "key")
        try:
            key.encode()
        except UnicodeEncodeError:
            raise _invalid("key is not valid Unicode", "key") from None
        if (
            isinstance(window_seconds, bool)
            or not isinstance(window_seconds, int | float)
            or not 0 < window_seconds <= MAX_CLAIM_WINDOW
        ):
            raise _invalid(
                f"window_seconds must be a number above 0 and at most {MAX_CLAIM_WINDOW:g}", "window_seconds"
            )
        return _Claim(key, self.writer.clock(), float(window_seconds), asyncio.get_running_loop().create_future())
