"""What a verify walk reads: the chain walk in batches, the last verified point, the facts anchors are checked
against (stored hashes, head, high-water mark, acknowledgements).

Reads only, on a connection the caller opened (one snapshot); journal/reads.py
`Reader.audit` and journal/acknowledge.py use them.  A walk of `SPLIT_MIN_RECORDS`
seqs or more is split: helper processes (journal/spanwalk.py) walk its later
spans and journal/spans.py joins their results into the one walk's answer.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from airlock.journal import chain, fastwalk, segments, spans, spanwalk
from airlock.journal.chain import Anchor, VerifyResult
from airlock.journal.schema import _COLUMNS, _read_head, _read_high

VERIFY_BATCH: Final = 2048


def _verify_chain(
    conn: sqlite3.Connection,
    from_seq: int | None,
    anchor: str | None,
    prev_hash: str | None = None,
    *,
    helpers: int | None = None,
    split_min: int | None = None,
) -> VerifyResult:
    """The chain walk (`fastwalk.verify_stored`) over the connection's snapshot; one of ``split_min`` seqs or
    more (default `SPLIT_MIN_RECORDS`) split with ``helpers`` processes (default: one per other core)."""
    if from_seq is None:
        # A live segment after a rollover begins with its opening record (journal/segments.py): its link
        # to the sealed segment before it is `verify --full`'s to check.
        first = conn.execute("SELECT seq, kind FROM events ORDER BY seq LIMIT 1").fetchone()
        if first is not None and first[1] == segments.OPEN_KIND and int(first[0]) > 1:
            from_seq = int(first[0])
    walk = chain._Walk(from_seq, anchor, prev_hash)
    start = from_seq or 1
    with _collector_paused():
        database = _database(conn)
        count = _helpers() if helpers is None else helpers
        least = SPLIT_MIN_RECORDS if split_min is None else split_min
        later = _spans(conn, start, count, least) if database else []
        running = [(part, spanwalk.Helper.start(database, part)) for part in later]
        started = [(part, helper) for part, helper in running if helper is not None]
        try:
            if not started or len(started) < len(running):  # one walk (a helper that did not start: all of it)
                return fastwalk.walk_stored(walk, _rows(conn, start)) or walk.end()
            return _walk_split(conn, walk, start, started)
        finally:
            for _, helper in started:
                helper.stop()


# Seqs below which a walk is not split. A helper answers a one-record span in ~34 ms (its start), and a
# split saves about half of ~5.5 us a record: even from ~12,000 on idle cores, but at load 4 on two
# cores a split of 60,000 was slower (0.90x) and of 200,000 faster (1.22x): docs/benchmarks-log.md, issue 50.
SPLIT_MIN_RECORDS: Final = 100_000
# The walk's own span is longer by what it walks while a helper starts (~34 ms at ~5.5 us a record).
HELPER_START_RECORDS: Final = 6_000
# At most this many helpers, whatever the cores: each holds a read snapshot and ~10 MiB.
MAX_HELPERS: Final = 3
# A helper's deadline: as long again as the walk's own share took, plus this (then the walk takes its span).
HELPER_SLACK_SECONDS: Final = 10.0


def _helpers() -> int:
    return max(0, min(MAX_HELPERS, len(os.sched_getaffinity(0)) - 1))


def _spans(conn: sqlite3.Connection, start: int, helpers: int, least: int) -> list[spans.Span]:
    """The spans for helpers (none for a short walk, or where a span has no stored link to start from)."""
    if helpers < 1:
        return []
    last = conn.execute("SELECT MAX(seq) FROM events").fetchone()[0]
    if last is None or int(last) - start + 1 < max(least, helpers + 1):
        return []
    ranges = spans.cut(start, int(last), helpers + 1, HELPER_START_RECORDS)[1:]
    found = []
    for first, end in ranges:
        part = spans.span(first, end, _stored_hash(conn, first - 1), _stored_hash(conn, end))
        if part is None:
            return []  # a link to start from is missing or not a hash: the walk will report it itself
        found.append(part)
    return found


def _walk_split(
    conn: sqlite3.Connection, walk: chain._Walk, start: int, started: list[tuple[spans.Span, spanwalk.Helper]]
) -> VerifyResult:
    own_end = started[0][0].first - 1
    began = time.monotonic()

    def outcome(helper: spanwalk.Helper) -> Callable[[], VerifyResult | None]:
        def wait() -> VerifyResult | None:
            spent = time.monotonic() - began
            return helper.result(timeout=spent + HELPER_SLACK_SECONDS)

        return wait

    def rows(part: spans.Span) -> Callable[[], Iterator[list[Any]]]:
        return lambda: _rows(conn, part.first, part.last)

    later = [(part, outcome(helper), rows(part)) for part, helper in started]
    # Past the last span, the rows the snapshot holds beyond it (none when the snapshot was taken first).
    return spans.walk_spans(walk, _rows(conn, start, own_end), later, lambda: _rows(conn, started[-1][0].last + 1))


def _rows(conn: sqlite3.Connection, first: int, last: int | None = None) -> Iterator[list[Any]]:
    if last is None:
        cursor = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE seq >= ? ORDER BY seq", (first,))
    else:
        cursor = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE seq >= ? AND seq <= ? ORDER BY seq", (first, last))
    return _batches(cursor)


def _stored_hash(conn: sqlite3.Connection, seq: int) -> object:
    row = conn.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()
    return None if row is None else row[0]


def _database(conn: sqlite3.Connection) -> str:
    """The file of the connection's main database (a helper opens it again, read-only); "" if in memory."""
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main":
            return str(file or "")
    return ""


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a walk runs (process-wide, counted across threads).

    A walk allocates millions of short-lived dicts (parsed payloads) and makes
    no cycles: the collections those allocations trigger cost more than the
    walk itself (measured: 2.1 s against 1.2 s for 200,000 records).
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _batches(cursor: sqlite3.Cursor) -> Iterator[list[Any]]:
    while batch := cursor.fetchmany(VERIFY_BATCH):
        yield batch


# The record the journal writes after a verify that reached the head (journal/service.py).
VERIFIED_KIND: Final = "chain.verified"


@dataclass(frozen=True, slots=True)
class VerifiedPoint:
    """Where an incremental verify starts: the chain up to ``seq``/``hash`` was verified, as the record at
    ``record_seq`` says (and an anchor at exactly that record vouches)."""

    seq: int
    hash: str
    record_seq: int
    time: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "record_seq": self.record_seq, "time": self.time}


def verified_point(
    conn: sqlite3.Connection, given: Iterable[Anchor], stored: Mapping[int, str]
) -> VerifiedPoint | None:
    """The newest last-verified point an anchor vouches for, or None (then the walk is full).

    A `VERIFIED_KIND` record counts only if the journal wrote it and one of
    ``given`` -- anchors kept outside the database -- names that very record
    (seq and hash, matching the database): the journal anchors each one as it
    writes it.  A record slipped into the database by someone else has no
    such anchor (the journal's anchors land on its own records), so it cannot
    move the start forward.  The walk then starts at the point and must meet
    its hash there (`chain.verify_rows`'s anchor), so a rewritten record at
    the point is caught too.  Newest anchor first; one primary-key read each.
    """
    for seq in sorted({a.seq for a in given if not a.ack and stored.get(a.seq) == a.hash}, reverse=True):
        row = conn.execute(
            "SELECT time, writer, kind, payload FROM events WHERE seq = ?",
            (seq,),
        ).fetchone()
        if row is None or row[1] != "journal" or row[2] != VERIFIED_KIND:
            continue
        try:
            payload = json.loads(row[3])
        except (ValueError, RecursionError):
            continue
        if not isinstance(payload, dict):
            continue
        point, digest = payload.get("seq"), payload.get("hash")
        if isinstance(point, int) and not isinstance(point, bool) and 1 <= point < seq and chain.is_hash(digest):
            return VerifiedPoint(point, str(digest), seq, str(row[0]))
    return None


@dataclass(frozen=True, slots=True)
class _Facts:
    head: tuple[int, str]
    high: int
    stored: dict[int, str]  # seq -> hash, for the seqs asked about that exist
    before: dict[int, int]  # for the seqs asked about that do not: the newest seq below
    acks: dict[int, tuple[str, dict[str, Any]]]  # seq -> (hash, payload) of acknowledgements


def _facts(conn: sqlite3.Connection, seqs: Iterable[int], *, acks: bool = True) -> _Facts:
    wanted = sorted(set(seqs))
    stored: dict[int, str] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for seq, digest in conn.execute(f"SELECT seq, hash FROM events WHERE seq IN ({marks})", chunk):
            stored[int(seq)] = str(digest)
    before: dict[int, int] = {}
    for seq in wanted:
        if seq not in stored:
            row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE seq < ?", (seq,)).fetchone()
            before[seq] = int(row[0])
    found: dict[int, tuple[str, dict[str, Any]]] = {}
    if acks:
        for seq, digest, payload in conn.execute(
            "SELECT seq, hash, payload FROM events WHERE kind = ? ORDER BY seq", (chain.ACK_KIND,)
        ):
            try:
                data = json.loads(payload)
            except ValueError:
                data = {}
            found[int(seq)] = (str(digest), data if isinstance(data, dict) else {})
    return _Facts(_read_head(conn), _read_high(conn), stored, before, found)


def _segment(seq: int, digest: str, payload: dict[str, Any], confirmed: bool) -> dict[str, Any]:
    """What `audit verify` shows of one acknowledgement record."""
    found = payload.get("previous")
    previous: dict[str, Any] = found if isinstance(found, dict) else {}
    return {
        "seq": seq,
        "hash": digest,
        "confirmed": confirmed,
        "previous_seq": previous.get("seq"),
        "operator": payload.get("operator"),
        "reason": payload.get("reason"),
        "contradicted": payload.get("contradicted"),
    }
