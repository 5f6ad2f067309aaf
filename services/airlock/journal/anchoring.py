"""The journal's anchors: its chain head written outside the database, signed, and checked at start.

`Anchoring` writes the head to the anchors file and journald (journal/anchors.py)
at start, at stop, every N records and every T seconds; `check_at_start`
refuses a chain that does not match its newest anchor; `shipping` sends every
committed record to journald when the journal logs there (journal/fleet.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airlock.common import checkpoint, log, sshsig
from airlock.common.codec import iso_utc
from airlock.common.kinds import NOTICES
from airlock.journal import anchors, journalfiles, memory
from airlock.journal.chain import Anchor, AnchorCheck
from airlock.journal.store import Store


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
                # A background task's own end (cancelled, or failed and logged by it) must not stop the stop.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


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


def identity() -> str | None:
    """This host's ``<hostname>/<machine-id>``, which its checkpoints name; None without a machine ID."""
    try:
        return journalfiles.local_host()
    except (OSError, ValueError) as exc:
        log.get().error(
            "journal.checkpoint.unsigned", message_id=NOTICES["journal.checkpoint.unsigned"], error=str(exc)
        )
        return None
