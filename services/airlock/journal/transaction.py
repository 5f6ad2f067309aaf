"""One batch of the journal's queue written as one transaction, on the writer thread.

`write_batch` chains the batch's records (seq, prev_hash, hash) above the
high-water mark, decides its request-ID claims, stores its settled
operations, and commits: all of it or none (journal/writer.py decides what to
do when it fails).
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from airlock.journal import chain
from airlock.journal.operations import OperationTable, Settled
from airlock.journal.records import Event
from airlock.journal.schema import _COLUMNS, _prune_operations, _raise_high
from airlock.journal.workitems import _Append, _Claim, _Settle, _Work


def write_batch(
    conn: sqlite3.Connection,
    lock: threading.Lock,
    ops: OperationTable,
    batch: list[_Work],
    head: tuple[int, str],
    high: int,
    evicted: list[str] | None = None,
) -> tuple[list[Event | None], list[bool], tuple[int, str]]:
    """Runs on the writer thread: chain the batch and commit it as one transaction.

    Returns the new events, the outcome of each claim in batch order, and the new head.
    Seqs continue above the high-water mark, never below: a deleted tail's
    numbers are not used again.
    """
    seq, prev = head
    top = max(seq, high)
    events: list[Event | None] = []
    rows: list[tuple[Any, ...]] = []
    settles: list[Settled] = [w.entry for w in batch if isinstance(w, _Settle)]
    claims: list[_Claim] = []
    for work in batch:
        if isinstance(work, _Claim):
            claims.append(work)
        elif isinstance(work, _Append) and work.claim is not None:
            claims.append(work.claim)
    with lock:
        conn = conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            won = dict(zip((id(c) for c in claims), _claim_all(conn, claims), strict=True))
            for work in batch:
                if not isinstance(work, _Append):
                    continue
                if work.claim is not None and not won[id(work.claim)]:
                    events.append(None)  # its key was held: nothing is written for it
                    continue
                top += 1
                seq = top
                record = {
                    "seq": seq,
                    "time": work.time,
                    "kind": work.kind,
                    "request_id": work.request_id,
                    "operation_id": work.operation_id,
                    "peer_uid": work.peer_uid,
                    "session": work.session,
                    "writer": work.writer,
                    "payload": work.payload,
                    "prev_hash": prev,
                }
                digest = chain.compute_hash_with(record, work.payload_json)  # one encoding of the payload
                events.append(
                    Event(
                        seq,
                        work.time,
                        work.kind,
                        work.request_id,
                        work.operation_id,
                        work.peer_uid,
                        work.session,
                        work.writer,
                        work.payload,
                        prev,
                        digest,
                    )
                )
                rows.append(
                    (
                        seq,
                        work.time,
                        work.kind,
                        work.request_id,
                        work.operation_id,
                        work.peer_uid,
                        work.session,
                        work.writer,
                        work.payload_json,
                        prev,
                        digest,
                    )
                )
                prev = digest
            if rows:
                conn.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
                _raise_high(conn, seq)
            if settles:
                conn.executemany(
                    "INSERT OR REPLACE INTO operations (operation_id, digest, outcome, completed_at) VALUES (?,?,?,?)",
                    [(s.operation_id, s.digest, s.outcome_json, s.completed_at) for s in settles],
                )
                _prune_operations(conn, ops.expiry_cutoff(), evicted or [])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite already rolled back (e.g. after SQLITE_FULL)
            raise
    claimed = [won[id(w)] for w in batch if isinstance(w, _Claim)]
    return events, claimed, (seq, prev)


def _claim_all(conn: sqlite3.Connection, claims: list[_Claim]) -> list[bool]:
    """Inside the writer's transaction: each claim wins unless its key is held and unexpired.

    In batch order, so of two claims of one key in one batch only the first wins.
    """
    if not claims:
        return []
    # Expired claims are dead weight; the index makes this a short range scan.
    conn.execute("DELETE FROM request_ids WHERE expires <= ?", (min(c.now for c in claims),))
    outcome = []
    for claim in claims:
        cursor = conn.execute(
            "INSERT INTO request_ids (key, expires) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET expires = excluded.expires WHERE request_ids.expires <= ?",
            (claim.key, claim.now + claim.window, claim.now),
        )
        outcome.append(cursor.rowcount == 1)
    return outcome
