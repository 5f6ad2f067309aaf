"""The journal's reads: the events feed, chain verification and the anchor checks.

Synchronous, and they may take a while on a large journal (verify): a service
calls them with asyncio.to_thread.  Each is safe from any thread: ``events``
uses the store's read-only connection under its lock; ``verify``, ``audit`` and
``check_tail`` open their own, so a long scan reads one consistent snapshot
without holding up ``events``.  `Reader` is one part of `Store` (see
`journal/store.py`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from airlock.journal import chain, segments
from airlock.journal.chain import Anchor, VerifyResult
from airlock.journal.records import MAX_PAGE, EventsPage, _event, _invalid, _optional_text, _optional_uid
from airlock.journal.schema import _COLUMNS, _reader
from airlock.journal.verification import VerifiedPoint, _facts, _segment, _verify_chain, verified_point

_SCOPES: Final[Mapping[str, type]] = {
    "request_id": str,
    "operation_id": str,
    "session": str,
    "peer_uid": int,
    "kind": str,
    # Request IDs that start so (issue 44: `show PREFIX --output`): an index range, never a pattern.
    "request_prefix": str,
}


class Reader:
    """`Store`'s reads: owns the read-only connection ``events`` uses (journal/writer.py reopens it after a
    rollover, under ``lock``) and the sealed segments' listing."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn
        self.lock = threading.Lock()
        self.archive_dir: Path | None = segments.default_archive_dir(path)
        self._sealed_cache: tuple[list[str], list[segments.SegmentInfo]] | None = None

    def events(
        self,
        *,
        after: int | None = None,
        tail: int | None = None,
        limit: int = 64,
        scope: dict[str, Any] | None = None,
    ) -> EventsPage:
        """One page of the events feed, oldest first (reference/004).

        - ``after=N``: events with seq > N (from the start when omitted), at
          most ``limit``.  ``next_cursor`` is the last seq returned when the
          page is full; otherwise everything up to ``latest`` has been seen and
          ``next_cursor`` is ``latest`` (so a scoped follower skips past events
          outside its scope).
        - ``tail=N``: the newest min(N, ``limit``) events; ``next_cursor`` is
          ``latest``.  ``tail=0`` just returns the cursor to follow from now.
          **``tail`` wins over ``after`` when both are given.**
        - ``scope``: any of ``request_id``, ``operation_id``, ``session``
          (strings) and ``peer_uid`` (integer); several keys must all match.
        - ``latest`` is the newest seq in the whole journal, read in the same
          snapshot as the page.

        Poll with ``after=next_cursor`` to follow.  No per-client state.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise _invalid(f"limit must be an integer from 1 to {MAX_PAGE}", "limit")
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= MAX_PAGE):
            raise _invalid(f"tail must be an integer from 0 to {MAX_PAGE}", "tail")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
            raise _invalid("after must be a non-negative integer", "after")
        where, params = _scope_sql(scope)
        with self.lock:
            conn = self.conn
            conn.execute("BEGIN")  # one snapshot for the page and `latest`
            try:
                latest = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])
                if tail is not None:
                    rows = conn.execute(
                        f"SELECT {_COLUMNS} FROM events WHERE {where} ORDER BY seq DESC LIMIT ?",
                        (*params, min(tail, limit)),
                    ).fetchall()
                    rows.reverse()
                    cursor = latest
                    first = conn.execute("SELECT MIN(seq) FROM events").fetchone()[0]
                    start = 0
                else:
                    start = after or 0
                    rows = conn.execute(
                        f"SELECT {_COLUMNS} FROM events WHERE seq > ? AND {where} ORDER BY seq LIMIT ?",
                        (start, *params, limit),
                    ).fetchall()
                    first = conn.execute("SELECT MIN(seq) FROM events").fetchone()[0]
            finally:
                conn.execute("COMMIT")
        if tail is not None:
            want = min(tail, limit)
            if len(rows) < want and first is not None and int(first) > 1:
                # Just after a rollover the live segment is short: the rest from the newest sealed files.
                rows = self._sealed_tail(int(first), where, params, want - len(rows)) + rows
        else:
            if first is not None and start < int(first) - 1:
                # Earlier records are in sealed segments: read there first (one indexed query per sealed
                # file that holds seqs after the cursor; docs/operations.md "The audit journal").
                earlier = self._sealed_rows(start, int(first), where, params, limit)
                rows = (earlier + rows)[:limit]
            cursor = rows[-1][0] if len(rows) == limit else max(start, latest)
        return EventsPage([_event(row) for row in rows], cursor, latest)

    def _sealed_tail(self, before: int, where: str, params: tuple[Any, ...], need: int) -> list[tuple[Any, ...]]:
        """The newest ``need`` rows below ``before`` matching ``where``, oldest first, from the sealed files."""
        out: list[tuple[Any, ...]] = []
        for info in reversed(self.sealed()):
            if info.first_seq >= before or len(out) >= need:
                continue
            try:
                conn = segments.connect_sealed(info.path)
            except sqlite3.Error:
                continue
            try:
                out += conn.execute(
                    f"SELECT {_COLUMNS} FROM events WHERE seq < ? AND {where} ORDER BY seq DESC LIMIT ?",
                    (before, *params, need - len(out)),
                ).fetchall()
            except sqlite3.Error:
                continue
            finally:
                conn.close()
        out.reverse()
        return out

    def _sealed_rows(
        self, start: int, before: int, where: str, params: tuple[Any, ...], limit: int
    ) -> list[tuple[Any, ...]]:
        """Rows with ``start < seq < before`` matching ``where``, oldest first, from the sealed files."""
        out: list[tuple[Any, ...]] = []
        for info in self.sealed():
            if info.last_seq <= start or info.first_seq >= before or len(out) >= limit:
                continue
            try:
                conn = segments.connect_sealed(info.path)
            except sqlite3.Error:
                continue
            try:
                out += conn.execute(
                    f"SELECT {_COLUMNS} FROM events WHERE seq > ? AND seq < ? AND {where} ORDER BY seq LIMIT ?",
                    (start, before, *params, limit - len(out)),
                ).fetchall()
            except sqlite3.Error:
                continue
            finally:
                conn.close()
        return out

    def verify(self, *, from_seq: int | None = None, anchor: str | None = None) -> VerifyResult:
        """Check the chain (all of it, or from ``from_seq``, optionally against an
        anchor hash kept off the host) and name the first bad record."""
        if from_seq is not None and (isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 1):
            raise _invalid("from_seq must be a positive integer", "from_seq")
        if anchor is not None and (from_seq is None or not chain.is_hash(anchor)):
            raise _invalid("anchor must be 64 lowercase hex digits and needs from_seq", "anchor")
        conn = _reader(self.path)
        try:
            conn.execute("BEGIN")
            return _verify_chain(conn, from_seq, anchor)
        finally:
            conn.close()

    def audit(
        self,
        anchors: Iterable[Anchor] | None = None,
        *,
        from_seq: int | None = None,
        anchor: str | None = None,
        check_chain: bool = True,
        incremental: bool = False,
    ) -> dict[str, Any]:
        """`verify` and, with ``anchors``, `chain.check_anchors`, from one snapshot.

        The answer of the ``verify`` verb: ``ok``, ``first_bad_seq`` and
        ``reason`` over both checks (the lowest bad seq wins), ``chain`` and
        ``anchors`` apart, the high-water mark and the segments begun by
        acknowledgements.  ``check_chain=False`` skips the chain walk (for a
        second batch of anchors).

        ``incremental`` (without ``from_seq``): the walk starts at the last
        verified point instead of seq 1 -- the newest `VERIFIED_KIND` record
        that an anchor given here names exactly (seq and hash), whose
        payload's ``seq``/``hash`` the walk then starts from and must meet
        (`verified_point`).  ``mode`` says which walk ran; ``verified`` names
        the point.  Without such a record it walks everything.
        """
        if from_seq is not None and (isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 1):
            raise _invalid("from_seq must be a positive integer", "from_seq")
        if anchor is not None and (from_seq is None or not chain.is_hash(anchor)):
            raise _invalid("anchor must be 64 lowercase hex digits and needs from_seq", "anchor")
        given = list(anchors or ())
        point: VerifiedPoint | None = None
        conn = _reader(self.path)
        try:
            conn.execute("BEGIN")
            facts = _facts(conn, [a.seq for a in given])
            if check_chain and incremental and from_seq is None:
                point = verified_point(conn, given, facts.stored)
                live_first = conn.execute("SELECT MIN(seq) FROM events").fetchone()[0]
                if point is not None and live_first is not None and point.seq < int(live_first):
                    point = None  # sealed since: the live segment is walked from its opening
            if point is not None:
                walked = _verify_chain(conn, point.seq, point.hash) if check_chain else None
            else:
                walked = _verify_chain(conn, from_seq, anchor) if check_chain else None
            given, sealed, retired = self._sealed_anchors(conn, given)
        finally:
            conn.close()
        checked = chain.check_anchors(
            given,
            stored=facts.stored | sealed,
            head_seq=facts.head[0],
            high_water=facts.high,
            acks={seq: h for seq, (h, _) in facts.acks.items()},
            before=facts.before,
        )
        confirmed = {a.seq for a in given if a.ack and facts.acks.get(a.seq, ("",))[0] == a.hash}
        bad = [(r.first_bad_seq, r.reason) for r in (walked, checked) if r is not None and not r.ok]
        first = min(bad, key=lambda b: b[0] or 0) if bad else (None, None)
        return {
            "ok": not bad,
            "checked": walked.checked if walked is not None else 0,
            "first_bad_seq": first[0],
            "reason": first[1],
            "head_seq": facts.head[0],
            "head_hash": facts.head[1],
            "high_water": facts.high,
            "mode": "incremental" if point is not None else ("full" if from_seq is None else "from"),
            "verified": point.to_dict() if point is not None else None,
            "chain": walked.to_dict() if walked is not None else None,
            "anchors": checked.to_dict() | {"given": len(given) + retired, "retired": retired},
            "segments": [
                _segment(seq, h, payload, seq in confirmed) for seq, (h, payload) in sorted(facts.acks.items())
            ],
        }

    def check_tail(self, last: Anchor | None) -> chain.AnchorCheck:
        """The start-up check: the newest anchor still matches, and the chain links from it to the head.

        Cheap: reads only the records since ``last``.  Without an anchor only
        the high-water mark is checked.
        """
        conn = _reader(self.path)
        try:
            conn.execute("BEGIN")
            facts = _facts(conn, [last.seq] if last else [], acks=False)
            kept, sealed, _ = self._sealed_anchors(conn, [last] if last else [])
            if last is not None and not kept:
                last = None  # it names a segment retention deleted: the live chain is checked from its start
            result = chain.check_anchors(
                kept,
                stored=facts.stored | sealed,
                head_seq=facts.head[0],
                high_water=facts.high,
                acks={},
                before=facts.before,
            )
            if result.ok and last is not None and last.seq in sealed:
                # The newest anchor is in a sealed segment (no anchor since the rollover): the live segment
                # is checked from its start.
                walked = _verify_chain(conn, None, None)
                if not walked.ok:
                    return chain.AnchorCheck(False, 1, 0, walked.first_bad_seq, walked.reason)
            elif result.ok and last is not None:
                walked = _verify_chain(conn, last.seq, last.hash)
                if not walked.ok:
                    return chain.AnchorCheck(False, 1, 0, walked.first_bad_seq, walked.reason)
            return result
        finally:
            conn.close()

    def sealed(self) -> list[segments.SegmentInfo]:
        """The sealed segments beside the live one and in the archive, oldest first."""
        folders = [segments.segments_dir(self.path)]
        if self.archive_dir is not None:
            folders.append(self.archive_dir)
        # Cached while the files are the same (sealed files never change; verify reads them afresh).
        key = [str(p) for p in segments.list_files(*folders)]
        cached = self._sealed_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        # Only new files are opened (a rollover adds one; a move to the archive renames one).
        by_name = {i.path.name: i for i in (cached[1] if cached else [])}
        found = []
        for path in map(Path, key):
            old = by_name.get(path.name)
            if old is not None and old.path == path:
                found.append(old)
                continue
            try:
                found.append(segments.read_info(path))
            except ValueError:
                continue
        found.sort(key=lambda i: i.first_seq)
        self._sealed_cache = (key, found)
        return found

    def _sealed_anchors(
        self, conn: sqlite3.Connection, given: list[Anchor]
    ) -> tuple[list[Anchor], dict[int, str], int]:
        """Anchors of seqs before the live segment: looked up in the sealed files.

        Returns the anchors still to check, the sealed hashes at their seqs, and how many were dropped
        because retention deleted their segment (its final hash stays in the live chain: `verify --full`).
        """
        row = conn.execute("SELECT MIN(seq) FROM events").fetchone()
        live_first = int(row[0]) if row and row[0] is not None else None
        older = [a for a in given if live_first is not None and a.seq < live_first]
        if not older:
            return given, {}, 0
        gone = self._deletions(conn)
        stored = segments.sealed_hashes(self.sealed(), [a.seq for a in older])
        kept, retired = [], 0
        deleted_through = max((d.last_seq for d in gone), default=0)  # retention deletes the oldest first
        for a in given:
            if a.seq not in stored and a.seq <= deleted_through:
                retired += 1
                continue
            kept.append(a)
        return kept, stored, retired

    def _deletions(self, conn: sqlite3.Connection) -> list[segments.Deletion]:
        """The ``segment.deleted`` records of the live database and of every sealed file still here."""
        found = segments.deletions(conn)
        for info in self.sealed():
            try:
                sealed = segments.connect_sealed(info.path)
            except sqlite3.Error:
                continue
            try:
                found += segments.deletions(sealed)
            except sqlite3.Error:
                continue
            finally:
                sealed.close()
        return sorted(found, key=lambda d: d.seq)

    def hash_at(self, seq: int) -> str | None:
        """The hash of record ``seq``, live or sealed; None if it is not here."""
        conn = _reader(self.path)
        try:
            row = conn.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()
        finally:
            conn.close()
        if row is not None:
            return str(row[0])
        return segments.sealed_hashes(self.sealed(), [seq]).get(seq)

    def verify_full(self, given: Iterable[Anchor] = ()) -> dict[str, Any]:
        """Every sealed file on its own and linked, then the live segment (``airlock audit verify --full``).

        A gap is excused only by a ``segment.deleted`` record that one of ``given`` names exactly
        (`segments.vouched`); the others are listed (``unanchored_deletions``) and excuse nothing.
        """
        folders = [segments.segments_dir(self.path)] + ([self.archive_dir] if self.archive_dir else [])
        # The live snapshot and the list of files are taken together: a rollover holds this lock.
        with self.lock:
            conn = _reader(self.path)
            conn.execute("BEGIN")
            row = conn.execute("SELECT seq, kind, prev_hash, payload FROM events ORDER BY seq LIMIT 1").fetchone()
            files = segments.list_files(*folders)
        try:
            walked = _verify_chain(conn, None, None)
            gone = self._deletions(conn)
        finally:
            conn.close()
        first = None if row is None else (int(row[0]), str(row[1]), str(row[2]), json.loads(row[3]))
        gone, unanchored = segments.vouched(gone, given)
        report = segments.verify_all(files, first, gone)
        report["unanchored_deletions"] = [{"seq": d.seq, "segment": d.number} for d in unanchored]
        if not report["ok"] and unanchored:
            report["reason"] = f"{report['reason']}; " + "; ".join(
                f"the segment.deleted record at seq {d.seq} (segment {d.number}) has no anchor of its own: "
                "this journal's retention did not write it"
                for d in unanchored[:4]
            )
        report["live"] = walked.to_dict()
        report["deleted"] = [
            {"segment": d.number, "first_seq": d.first_seq, "last_seq": d.last_seq, "final_hash": d.final_hash}
            for d in gone
        ]
        if report["ok"] and not walked.ok:
            report |= {"ok": False, "first_bad_seq": walked.first_bad_seq, "reason": walked.reason}
        report["checked"] = int(report["checked"]) + walked.checked
        return report


# Rows per fetch of a chain walk: memory stays bounded (a few MiB) however long the journal.
def _scope_sql(scope: dict[str, Any] | None) -> tuple[str, tuple[Any, ...]]:
    if not scope:
        return "1", ()
    if not isinstance(scope, dict):
        raise _invalid("scope must be an object", "scope")
    clauses, params = [], []
    for key, value in sorted(scope.items()):
        kind = _SCOPES.get(key)
        if kind is None:
            raise _invalid(f"unknown scope {key!r} (use one of {', '.join(sorted(_SCOPES))})", "scope")
        if kind is int:
            _optional_uid(value)
            if value is None:
                raise _invalid("scope peer_uid must be an integer", "scope")
        elif _optional_text(f"scope {key}", value) is None:
            raise _invalid(f"scope {key} must be a string", "scope")
        if key == "request_prefix":
            clauses.append("request_id >= ? AND request_id < ?")
            params += [value, _after_prefix(value)]
            continue
        clauses.append(f"{key} = ?")  # key is one of _SCOPES, never caller text
        params.append(value)
    return " AND ".join(clauses), tuple(params)


def _after_prefix(prefix: str) -> str:
    """The least text above every text that starts with ``prefix`` (SQLite compares UTF-8 bytes, so code points)."""
    last = ord(prefix[-1]) if prefix else 0x10FFFF
    if last == 0x10FFFF:
        raise _invalid("scope request_prefix must be text not ending in U+10FFFF", "scope")
    step = 0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1  # no surrogates in UTF-8
    return prefix[:-1] + chr(step)
