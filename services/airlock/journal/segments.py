"""The audit chain cut into segments: sealing, the closed files, and verifying across them (issue 38).

The live database (``journal.sqlite``) is the newest segment.  When it
reaches ``journal.segment_max_bytes`` or its first record is
``journal.segment_max_age`` old, the writer thread seals it between two
batches (nothing else writes meanwhile, so no record is lost or written
twice):

1. the live file leaves WAL mode (this needs every other connection to it
   closed; if one is open the rollover waits for a later batch);
2. a ``segment.sealed`` record is appended: the segment's last record, naming
   its number, file name and first and last seq;
3. the next database is built beside it (``journal.sqlite.next``): the
   schema, the replay state (``operations``, ``request_ids``, ``chain_high``)
   copied over, and a ``segment.opened`` record whose ``prev_hash`` is the
   seal's hash and whose payload names the sealed segment (file, range, final
   hash) -- the choice made here: the *next* segment's first record names the
   previous segment's final hash, because a record cannot name a hash that
   depends on itself;
4. the sealed file is hard-linked into ``segments/journal-NNNNNN.db``, the
   next database renamed over ``journal.sqlite`` (atomic: a reader finds one
   or the other, never neither), and the sealed file made read-only (0440).

A crash anywhere in 2-4 leaves a live file whose newest record is a seal;
`Store.open` finishes the rollover from step 3 (`finish`).

A sealed segment verifies on its own (`verify_file`: its chain from its first
record, ending in its seal), and the segments link into one chain: each
``segment.opened`` record's ``prev_hash`` is the previous segment's final
hash.  `verify_all` walks every file in order (``airlock audit verify
--full``).  A segment deleted by retention (journal/retention.py) is
represented in the live chain by a ``segment.deleted`` record with its range
and final hash, so the walk accepts exactly that gap and no other.

Files are opened read-only and ``immutable`` (no locks, no side files): a
sealed segment never changes, and a change is what verification reports.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from airlock.journal import chain
from airlock.journal.chain import GENESIS, Anchor
from airlock.journal.schema import _COLUMNS, CACHE_KIB

SEAL_KIND: Final = "segment.sealed"
OPEN_KIND: Final = "segment.opened"
DELETED_KIND: Final = "segment.deleted"
SEGMENTS_DIR: Final = "segments"
ARCHIVE_DIR: Final = "journal-archive"
_NAME = re.compile(r"journal-(\d{6,})\.db")


def file_name(number: int) -> str:
    return f"journal-{number:06d}.db"


def segments_dir(database: Path) -> Path:
    """Where sealed segments of the journal ``database`` go."""
    return Path(database).with_name(SEGMENTS_DIR)


def default_archive_dir(database: Path) -> Path:
    return Path(database).with_name(ARCHIVE_DIR)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A sealed segment file: its number, range, the hash its first record links to and its final hash."""

    path: Path
    number: int
    first_seq: int
    last_seq: int
    first_prev: str
    final_hash: str
    sealed_at: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": str(self.path),
            "segment": self.number,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "final_hash": self.final_hash,
            "sealed_at": self.sealed_at,
            "bytes": self.size,
        }


def connect_sealed(path: Path) -> sqlite3.Connection:
    """A read-only, lock-free connection to a sealed segment (it never changes)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=10)
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    return conn


def read_info(path: Path) -> SegmentInfo:
    """What a sealed file says about itself (its first and last records); `ValueError` if it is not one."""
    try:
        conn = connect_sealed(path)
    except sqlite3.Error as exc:
        raise ValueError(f"{path}: cannot open: {exc}") from None
    try:
        first = conn.execute("SELECT seq, kind, payload, prev_hash FROM events ORDER BY seq LIMIT 1").fetchone()
        last = conn.execute("SELECT seq, kind, payload, hash, time FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    except sqlite3.Error as exc:
        raise ValueError(f"{path}: not a journal segment ({exc})") from None
    finally:
        conn.close()
    if first is None or last is None:
        raise ValueError(f"{path}: the segment holds no records")
    if last[1] != SEAL_KIND:
        raise ValueError(f"{path}: the segment does not end in a {SEAL_KIND} record (it was not sealed, or cut)")
    try:
        seal = json.loads(last[2])
        number = int(seal["segment"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}: its seal record is unreadable") from None
    return SegmentInfo(
        Path(path), number, int(first[0]), int(last[0]), str(first[3]), str(last[3]), str(last[4]), _size(path)
    )


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def list_files(*folders: Path) -> list[Path]:
    """Every ``journal-NNNNNN.db`` in the folders (that exist)."""
    found: list[Path] = []
    for folder in folders:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        found.extend(folder / n for n in sorted(names) if _NAME.fullmatch(n))
    return found


def scan(*folders: Path) -> list[SegmentInfo]:
    """The readable sealed segments in the folders, oldest first (unreadable ones are skipped: verify names them)."""
    out = []
    for path in list_files(*folders):
        try:
            out.append(read_info(path))
        except ValueError:
            continue
    return sorted(out, key=lambda s: s.first_seq)


def _rows(conn: sqlite3.Connection) -> Iterator[dict[str, Any]]:
    cursor = conn.execute(f"SELECT {_COLUMNS} FROM events ORDER BY seq")
    names = [d[0] for d in cursor.description]
    for row in cursor:
        yield dict(zip(names, row, strict=True))


def verify_file(path: Path) -> dict[str, Any]:
    """Check one sealed segment on its own: its chain, its seal, and its opening record's link.

    The first record's ``prev_hash`` is taken on trust here (it is checked
    against the previous segment by `verify_all`), except for the first
    segment, which must start at seq 1 from `GENESIS`.
    """
    out: dict[str, Any] = {"file": str(path), "ok": False, "checked": 0, "first_bad_seq": None, "reason": None}
    try:
        info = read_info(path)
    except ValueError as exc:
        return out | {"reason": str(exc)}
    out |= info.to_dict() | {"file": str(path), "first_prev_hash": info.first_prev}
    conn = connect_sealed(path)
    try:
        start = None if info.first_seq == 1 else info.first_seq
        result = chain.verify_rows(_rows(conn), from_seq=start)
        first = conn.execute("SELECT kind, payload, prev_hash FROM events ORDER BY seq LIMIT 1").fetchone()
        seal = json.loads(conn.execute("SELECT payload FROM events WHERE seq = ?", (info.last_seq,)).fetchone()[0])
    except (sqlite3.Error, ValueError) as exc:
        return out | {"reason": f"cannot read the segment: {exc}"}
    finally:
        conn.close()
    out |= {"checked": result.checked}
    if not result.ok:
        return out | {"first_bad_seq": result.first_bad_seq, "reason": result.reason}
    if result.head_seq != info.last_seq:
        return out | {"first_bad_seq": info.last_seq, "reason": "the seal is not the segment's last record"}
    if seal.get("first_seq") != info.first_seq or seal.get("last_seq") != info.last_seq:
        return out | {
            "first_bad_seq": info.first_seq,
            "reason": f"the seal names seqs {seal.get('first_seq')}-{seal.get('last_seq')}, the file holds "
            f"{info.first_seq}-{info.last_seq} (records were cut from its start)",
        }
    if info.first_seq > 1:
        if first[0] != OPEN_KIND:
            return out | {"first_bad_seq": info.first_seq, "reason": "the segment does not begin with its opening"}
        previous = (json.loads(first[1]).get("previous") or {}) if first[1] else {}
        if previous.get("hash") != first[2] or previous.get("segment") != info.number - 1:
            return out | {"first_bad_seq": info.first_seq, "reason": "its opening record names another segment"}
    return out | {"ok": True}


@dataclass(frozen=True, slots=True)
class Deletion:
    """A ``segment.deleted`` record of the live chain: segment ``number`` (seqs first..last, final hash) is gone."""

    seq: int
    number: int
    first_seq: int
    last_seq: int
    final_hash: str
    hash: str = ""  # the deletion record's own hash: an anchor must name it (`vouched`)


def deletions(conn: sqlite3.Connection) -> list[Deletion]:
    """The ``segment.deleted`` records of the (live) database ``conn``."""
    out = []
    rows = conn.execute("SELECT seq, hash, payload FROM events WHERE kind = ? ORDER BY seq", (DELETED_KIND,))
    for seq, digest, payload in rows:
        try:
            p = json.loads(payload)
            number, first, last = int(p["segment"]), int(p["first_seq"]), int(p["last_seq"])
            out.append(Deletion(int(seq), number, first, last, str(p["final_hash"]), str(digest)))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def vouched(gone: Iterable[Deletion], given: Iterable[Anchor]) -> tuple[list[Deletion], list[Deletion]]:
    """The deletions an anchor names exactly (seq and the record's hash), and the rest (issue 51).

    The journal anchors each ``segment.deleted`` record as it writes it, like a
    verified point; a record slipped into the database by someone else (to
    excuse a segment they removed) has no anchor of its own: it never lands on
    the journal's anchors, which follow the journal's own records.
    """
    named = {(a.seq, a.hash) for a in given if not a.ack}
    good: list[Deletion] = []
    bad: list[Deletion] = []
    for d in gone:
        (good if (d.seq, d.hash) in named else bad).append(d)
    return good, bad


def verify_all(
    files: Iterable[Path], live_first: tuple[int, str, str, dict[str, Any]] | None, gone: Iterable[Deletion]
) -> dict[str, Any]:
    """Walk every sealed segment and link them, and the live segment, into one chain.

    ``live_first``: the live database's first record (seq, kind, prev_hash,
    payload).  ``gone``: the deletions the live chain records.  Every file
    must verify on its own; consecutive segments must link (the later one's
    first ``prev_hash`` is the earlier one's final hash); a gap is accepted
    only where a deletion record names exactly the missing segment.  The
    history must begin at seq 1 (or at a journaled deletion) and end in the
    live segment.
    """
    results = [verify_file(p) for p in files]
    bad = [r for r in results if not r["ok"]]
    report: dict[str, Any] = {
        "ok": False,
        "segments": len(results),
        "checked": sum(int(r["checked"]) for r in results),
        "files": results,
        "first_bad_seq": None,
        "reason": None,
    }
    if bad:
        worst = min(bad, key=lambda r: r.get("first_bad_seq") or r.get("first_seq") or 0)
        return report | {"first_bad_seq": worst.get("first_bad_seq"), "reason": f"{worst['file']}: {worst['reason']}"}
    # Retention deletes the oldest segments only, so the newest deletion record covers every segment
    # up to its own: the history resumes after it (files of deleted segments still here are checked above).
    pieces: dict[int, tuple[int, int, str, str, str]] = {}
    for r in sorted(results, key=lambda r: int(r["first_seq"])):
        if r["segment"] in pieces:
            return report | {"first_bad_seq": r["first_seq"], "reason": f"segment {r['segment']} is there twice"}
        pieces[r["segment"]] = (r["first_seq"], r["last_seq"], r["first_prev_hash"], r["final_hash"], r["file"])
    expected_seq, expected_prev, number = 1, GENESIS, 1
    newest = max(gone, key=lambda d: d.number, default=None)
    if newest is not None:
        expected_seq, expected_prev, number = newest.last_seq + 1, newest.final_hash, newest.number + 1
        report["deleted_through"] = {"segment": newest.number, "last_seq": newest.last_seq, "seq": newest.seq}
    for n in sorted(k for k in pieces if k >= number):
        first, last, prev, final, name = pieces[n]
        if n != number:
            return report | {
                "first_bad_seq": expected_seq,
                "reason": f"segment {number} is missing (no file, no deletion record): seqs from {expected_seq} "
                "are unaccounted for",
            }
        if first != expected_seq or prev != expected_prev:
            return report | {
                "first_bad_seq": first,
                "reason": f"{name}: does not link to the segment before it (expected seq {expected_seq} after "
                f"hash {expected_prev})",
            }
        expected_seq, expected_prev, number = last + 1, final, n + 1
    if live_first is not None:
        seq, kind, prev, payload = live_first
        if seq != 1 or number > 1:
            previous = payload.get("previous") if isinstance(payload, dict) else None
            if kind != OPEN_KIND or not isinstance(previous, dict) or previous.get("segment") != number - 1:
                return report | {
                    "first_bad_seq": seq,
                    "reason": f"the live segment does not open after the last sealed one (segment {number - 1})",
                }
            if seq != expected_seq or prev != expected_prev:
                return report | {
                    "first_bad_seq": seq,
                    "reason": "the live segment does not link to the last sealed "
                    f"segment (expected seq {expected_seq} after hash {expected_prev})",
                }
    return report | {"ok": True}


def sealed_hashes(infos: Iterable[SegmentInfo], seqs: Iterable[int]) -> dict[int, str]:
    """seq -> hash, from the sealed files, for those of ``seqs`` they hold (each file opened once)."""
    wanted = sorted(set(seqs))
    found: dict[int, str] = {}
    for info in infos:
        inside = [q for q in wanted if info.first_seq <= q <= info.last_seq]
        if not inside:
            continue
        try:
            conn = connect_sealed(info.path)
        except sqlite3.Error:
            continue
        try:
            for start in range(0, len(inside), 500):
                chunk = inside[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for seq, digest in conn.execute(f"SELECT seq, hash FROM events WHERE seq IN ({marks})", chunk):
                    found[int(seq)] = str(digest)
        except sqlite3.Error:
            continue
        finally:
            conn.close()
    return found


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
