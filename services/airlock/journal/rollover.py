"""Sealing the live database into a segment and opening the next one (on the writer thread).

A rollover (journal/writer.py decides when) renames the live database into
``segments/`` as a sealed, read-only file whose last record is
``segment.sealed``, and opens a new live database whose first record,
``segment.opened``, links to it and carries what must outlive it: the newest
hold or release and the grants still in force (`carry`), which approval reads
back at start through the journal's generic ``records`` read
(journal/select.py; approval/restore.py interprets them).  A rollover a crash
interrupted is finished at the next open (`seal_pending`, `finish`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from airlock.common import log
from airlock.common.codec import canonical_json, iso_utc
from airlock.common.wire.journal import CARRIED
from airlock.journal import chain, select
from airlock.journal.records import Event
from airlock.journal.schema import _COLUMNS, CACHE_KIB, _create_private, _migrate, _raise_high
from airlock.journal.segments import OPEN_KIND, SEAL_KIND, _fsync_dir, file_name, list_files, segments_dir

# -- rollover (on the writer thread) ----------------------------------------------


def live_segment(conn: sqlite3.Connection) -> tuple[int, int | None, float | None]:
    """(segment number, first seq, first record's time as epoch seconds) of the live database."""
    row = conn.execute("SELECT seq, kind, payload, time FROM events ORDER BY seq LIMIT 1").fetchone()
    if row is None:
        return 1, None, None
    number = 1
    if row[1] == OPEN_KIND:
        try:
            number = int(json.loads(row[2])["segment"])
        except (ValueError, KeyError, TypeError):
            number = 1
    try:
        opened: float | None = datetime.fromisoformat(str(row[3]).replace("Z", "+00:00")).timestamp()
    except ValueError:
        opened = None
    return number, int(row[0]), opened


def _record(seq: int, when: str, kind: str, payload: dict[str, Any], prev: str) -> tuple[tuple[Any, ...], Event]:
    text = canonical_json(payload).decode()
    record = {
        "seq": seq,
        "time": when,
        "kind": kind,
        "request_id": None,
        "operation_id": None,
        "peer_uid": None,
        "session": None,
        "writer": "journal",
        "payload": payload,
        "prev_hash": prev,
    }
    digest = chain.compute_hash_with(record, text)
    row = (seq, when, kind, None, None, None, None, "journal", text, prev, digest)
    return row, Event(seq, when, kind, None, None, None, None, "journal", payload, prev, digest)


# Switching the new live file to WAL needs it to itself for a moment: a reader that opened it right after
# the rename holds it briefly.  Tried this often, this far apart (bounded: 5 s).
_WAL_TRIES: Final = 50
_WAL_PAUSE: Final = 0.1


def _open_live(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
    conn.execute("PRAGMA synchronous=FULL")
    mode = ""
    for _ in range(_WAL_TRIES):
        try:
            mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError:
            mode = ""
        if mode == "wal":
            break
        time.sleep(_WAL_PAUSE)
    if mode != "wal":
        # Still durable (a rollback journal, synchronous=FULL); WAL again at the next start or rollover.
        log.get().warning("journal.segment.not_wal", database=str(path))
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    return conn


def seal(
    path: Path, wconn: sqlite3.Connection, head: tuple[int, str], high: int, now: float
) -> tuple[sqlite3.Connection, list[Event], tuple[int, str]]:
    """Seal the live database and open the next (steps 1-4 of the module doc).

    Returns the new writer connection, the records written (seal, opening)
    and the new head.  On an error before the seal is committed nothing has
    changed (the file is back in WAL mode); after it, `finish` completes the
    rollover (here, or at the next open).
    """
    number, first, _ = live_segment(wconn)
    if first is None:
        raise ValueError("an empty segment is not sealed")
    mode = wconn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
    if str(mode).lower() != "delete":
        raise sqlite3.OperationalError("the journal database is open elsewhere; the rollover waits")
    try:
        seq = max(head[0], high) + 1
        payload = {"segment": number, "file": file_name(number), "first_seq": first, "last_seq": seq}
        row, event = _record(seq, iso_utc(now), SEAL_KIND, payload, head[1])
        wconn.execute("BEGIN IMMEDIATE")
        try:
            wconn.execute(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
            _raise_high(wconn, seq)
            wconn.execute("COMMIT")
        except BaseException:
            if wconn.in_transaction:
                wconn.execute("ROLLBACK")
            raise
    except BaseException:
        wconn.execute("PRAGMA journal_mode=WAL")
        raise
    conn, opened, new_head = finish(path, wconn, now)
    return conn, [event, *opened], new_head


def finish(
    path: Path, wconn: sqlite3.Connection, now: float
) -> tuple[sqlite3.Connection, list[Event], tuple[int, str]]:
    """Steps 3-4: the live file ends in its seal; build the next database and put it in place.

    Idempotent: a crash anywhere in it is finished by running it again.
    """
    last = wconn.execute("SELECT seq, kind, payload, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    if last is None or last[1] != SEAL_KIND:
        raise ValueError("the live database does not end in a seal")
    sealed = json.loads(last[2])
    number = int(sealed["segment"])
    wconn.execute("PRAGMA journal_mode=DELETE")  # after a crash the file may be back in WAL mode
    nxt = path.with_name(path.name + ".next")
    for stale in (nxt, nxt.with_name(nxt.name + "-journal")):
        stale.unlink(missing_ok=True)
    _create_private(nxt)
    nconn = sqlite3.connect(nxt, isolation_level=None, check_same_thread=False, timeout=10)
    try:
        nconn.execute("PRAGMA synchronous=FULL")
        _migrate(nconn)
        nconn.execute("ATTACH DATABASE ? AS old", (str(path),))
        opened_payload = {
            "carried": carry(wconn),
            "segment": number + 1,
            "previous": {
                "segment": number,
                "file": file_name(number),
                "first_seq": sealed["first_seq"],
                "last_seq": int(last[0]),
                "hash": str(last[3]),
            },
        }
        row, opened = _record(int(last[0]) + 1, iso_utc(now), OPEN_KIND, opened_payload, str(last[3]))
        nconn.execute("BEGIN IMMEDIATE")
        nconn.execute("INSERT INTO request_ids SELECT * FROM old.request_ids")
        nconn.execute("INSERT INTO operations SELECT * FROM old.operations")
        nconn.execute(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
        high = nconn.execute("SELECT seq FROM old.chain_high WHERE id = 1").fetchone()
        _raise_high(nconn, max(int(high[0]) if high else 0, opened.seq))
        nconn.execute("COMMIT")
        nconn.execute("DETACH DATABASE old")
    finally:
        nconn.close()
    wconn.close()
    folder = segments_dir(path)
    folder.mkdir(mode=0o700, exist_ok=True)
    target = folder / file_name(number)
    if target.exists():
        if not os.path.samefile(target, path):
            raise OSError(f"{target} exists and is another file: the rollover stops here")
    else:
        os.link(path, target)
    _fsync_dir(folder)
    os.rename(nxt, path)
    _fsync_dir(path.parent)
    os.chmod(target, 0o440)
    conn = _open_live(path)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.chmod(side, 0o600)
    return conn, [opened], (opened.seq, opened.hash)


def seal_pending(conn: sqlite3.Connection) -> bool:
    """Whether the live database ends in a seal (a rollover a crash interrupted)."""
    row = conn.execute("SELECT kind FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    return row is not None and row[0] == SEAL_KIND


def tighten(folder: Path) -> None:
    """Sealed files are read-only (a crash may have left the newest writable)."""
    for path in list_files(folder):
        try:
            if os.stat(path).st_mode & 0o777 != 0o440:
                os.chmod(path, 0o440)
        except OSError:
            continue


# -- what a new segment carries over -----------------------------------------------------------------


def carry(conn: sqlite3.Connection) -> dict[str, Any]:
    """What the next segment's opening record carries, by name (`wire.journal.CARRIED`): what the live
    segment carried under that name and the live records that answer its query, the newest ``limit``.

    The journal runs the queries without knowing what the records mean; the service that declared them
    interprets what comes back (approval/restore.py).  A carried item is kept as it was written (an
    opening record of an older journal carried approval's own reading of its records).
    """
    before = select.carried(conn) or {}
    out: dict[str, Any] = {}
    for name, query in CARRIED.items():
        earlier = before.get(name)
        items = earlier if isinstance(earlier, list) else [earlier] if isinstance(earlier, dict) else []
        out[name] = [*items, *select.rows(conn, query)][-query.limit :]
    return out
