"""The journal database's schema, its migrations, and the small SQL helpers every part uses.

One SQLite file: ``events`` (the hash chain), ``operations`` (settled
outcomes for replay), ``request_ids`` (intake's replay guard) and
``chain_high`` (the highest seq ever written).  `_migrate` brings a file of
an older version up to `SCHEMA_VERSION` in one transaction; the
append-only triggers are re-created at every open if someone dropped them.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from airlock.journal.chain import GENESIS
from airlock.journal.operations import Settled

SCHEMA_VERSION: Final = 3
CACHE_KIB: Final = 512  # SQLite page cache per connection

_SCHEMA: Final = """
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY,   -- assigned by the writer, never reused
    time         TEXT NOT NULL,
    kind         TEXT NOT NULL,
    request_id   TEXT,
    operation_id TEXT,
    peer_uid     INTEGER,
    session      TEXT,
    writer       TEXT NOT NULL,
    payload      TEXT NOT NULL,         -- canonical JSON, exactly as hashed
    prev_hash    TEXT NOT NULL,
    hash         TEXT NOT NULL
);
CREATE INDEX events_request   ON events (request_id, seq)   WHERE request_id IS NOT NULL;
CREATE INDEX events_operation ON events (operation_id, seq) WHERE operation_id IS NOT NULL;
CREATE INDEX events_session   ON events (session, seq)      WHERE session IS NOT NULL;
CREATE INDEX events_peer      ON events (peer_uid, seq)     WHERE peer_uid IS NOT NULL;
CREATE TABLE operations (
    ord          INTEGER PRIMARY KEY,   -- completion order: eviction order
    operation_id TEXT NOT NULL UNIQUE,
    digest       TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    completed_at REAL NOT NULL
);
"""


# Schema 2: request IDs claimed within the replay window (intake's replay guard).
_SCHEMA_2: Final = """
CREATE TABLE request_ids (
    key     TEXT PRIMARY KEY,              -- "<peer uid>:<request id>"
    expires REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX request_ids_expires ON request_ids (expires);
"""


# Schema 3: the highest seq ever written, so a deleted tail is never written
# again under the same numbers (and is evident: high-water above the head).
_SCHEMA_3: Final = """
CREATE TABLE IF NOT EXISTS chain_high (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT OR IGNORE INTO chain_high (id, seq) SELECT 1, COALESCE(MAX(seq), 0) FROM events;
"""


# Defence in depth against our own bugs; the hash chain and the anchors are
# what catch someone with write access to the file.  Re-created at every open
# if missing (`Store.restored_triggers` names them).
_TRIGGERS: Final[Mapping[str, str]] = {
    "events_no_update": "CREATE TRIGGER events_no_update BEFORE UPDATE ON events\n"
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;",
    "events_no_delete": "CREATE TRIGGER events_no_delete BEFORE DELETE ON events\n"
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;",
    "chain_high_no_lower": "CREATE TRIGGER chain_high_no_lower BEFORE UPDATE ON chain_high WHEN NEW.seq < OLD.seq\n"
    "BEGIN SELECT RAISE(ABORT, 'the high-water mark never goes down'); END;",
    "chain_high_no_delete": "CREATE TRIGGER chain_high_no_delete BEFORE DELETE ON chain_high\n"
    "BEGIN SELECT RAISE(ABORT, 'the high-water mark never goes down'); END;",
}


_COLUMNS: Final = "seq, time, kind, request_id, operation_id, peer_uid, session, writer, payload, prev_hash, hash"


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does (SQLite gives its -wal
    and -shm files the main file's mode), and tighten an existing one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


# A read-only connection cannot set up a WAL file's shared index itself: opened in the moment a
# rollover has put a fresh live file in place and no writer has it open yet, its first read fails
# with "attempt to write a readonly database" (SQLITE_READONLY_CANTINIT).  It is looked at again,
# for at most this long, as a writer opens the file within milliseconds.
_READER_SETTLE_SECONDS = 2.0


def _reader(path: Path) -> sqlite3.Connection:
    give_up = time.monotonic() + _READER_SETTLE_SECONDS
    while True:
        conn = sqlite3.connect(
            path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None, check_same_thread=False, timeout=10
        )
        try:
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # the WAL index, now
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if "readonly" not in str(exc) or time.monotonic() >= give_up:
                raise
            time.sleep(0.01)


def _migrate(conn: sqlite3.Connection) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == SCHEMA_VERSION:
        return
    if version not in (0, 1, 2):
        raise sqlite3.DatabaseError(f"unknown journal schema version {version} (this airlock knows {SCHEMA_VERSION})")
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Version 0 is an empty file; version 1 lacks the request IDs; version 2 the high-water mark.
        script = (_SCHEMA if version == 0 else "") + (_SCHEMA_2 if version < 2 else "") + _SCHEMA_3
        for statement in _split_sql(script):
            conn.execute(statement)
        # The triggers this migration brings; any other missing one is
        # `_restore_triggers`'s to re-create, and to report.
        present = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        for name, sql in _TRIGGERS.items():
            if (version == 0 or name.startswith("chain_high_")) and name not in present:
                conn.execute(sql)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _restore_triggers(conn: sqlite3.Connection) -> list[str]:
    """Re-create any of `_TRIGGERS` that someone dropped; return their names."""
    present = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    missing = [name for name in _TRIGGERS if name not in present]
    if missing:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for name in missing:
                conn.execute(_TRIGGERS[name])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return missing


def _raise_high(conn: sqlite3.Connection, seq: int) -> None:
    conn.execute(
        "INSERT INTO chain_high (id, seq) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET seq = excluded.seq "
        "WHERE excluded.seq > chain_high.seq",
        (seq,),
    )


def _read_high(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT seq FROM chain_high WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def _split_sql(script: str) -> list[str]:
    """Statements of a script (triggers hold ';' inside BEGIN … END)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [s for s in statements if s]


def _read_head(conn: sqlite3.Connection) -> tuple[int, str]:
    row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))


def _read_operations(conn: sqlite3.Connection, cutoff: float) -> list[Settled]:
    rows = conn.execute(
        "SELECT operation_id, digest, outcome, completed_at FROM operations WHERE completed_at > ? ORDER BY ord",
        (cutoff,),
    ).fetchall()
    return [Settled(str(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in rows]


def _prune_operations(conn: sqlite3.Connection, cutoff: float, evicted: list[str]) -> None:
    """Expired outcomes, and those the replay table evicted (each agent's own oldest, past its share)."""
    conn.execute("DELETE FROM operations WHERE completed_at <= ?", (cutoff,))
    conn.executemany("DELETE FROM operations WHERE operation_id = ?", [(key,) for key in evicted])
