"""Acknowledging a cut or rewritten tail: the one offline write to the journal (``airlock audit acknowledge``).

Runs as root on the database file with no service in between; see `acknowledge`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal import chain
from airlock.journal.chain import Anchor
from airlock.journal.records import MAX_PAYLOAD_BYTES, Event, _canonical_object, _invalid, _unavailable
from airlock.journal.schema import _COLUMNS, _migrate, _raise_high, _restore_triggers
from airlock.journal.verification import _facts, _verify_chain


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """The acknowledgement record written, and the mismatch it acknowledged."""

    event: Event
    mismatch: chain.AnchorCheck


def acknowledge(
    path: Path,
    anchors: Iterable[Anchor],
    *,
    operator: str,
    uid: int,
    reason: str,
    clock: Callable[[], float] = time.time,
) -> Acknowledged:
    """Start a new chain segment over a mismatch with the anchors (the journal is stopped).

    One transaction: the whole chain is walked and compared with ``anchors``;
    if they disagree, a ``chain.acknowledged`` record is appended that links
    to the last record left (its ``prev_hash``), takes the seq above
    everything ever written or anchored, and records the old head, the
    high-water mark, the first contradiction, who acknowledged it and why.
    The caller writes its ack anchor.  Refused (``conflict``) when nothing
    disagrees, or when the chain is broken inside (an edited record is not a
    cut or a rewritten tail: it stays evident).
    """
    given = list(anchors)
    reason = validate_reason(reason)
    if not path.is_file():
        raise AirlockError(ErrorCode.NOT_FOUND, f"no audit journal at {path}", {"path": str(path)})
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    try:
        conn.execute("PRAGMA synchronous=FULL")
        _migrate(conn)
        _restore_triggers(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            walked = _verify_chain(conn, None, None)
            facts = _facts(conn, [a.seq for a in given])
            if not walked.ok:
                raise AirlockError(
                    ErrorCode.CONFLICT,
                    f"the chain is broken inside at seq {walked.first_bad_seq} ({walked.reason}); an "
                    "acknowledgement covers a cut or rewritten tail, not that: see docs/operations.md",
                    {"first_bad_seq": walked.first_bad_seq},
                )
            mismatch = chain.check_anchors(
                given,
                stored=facts.stored,
                head_seq=facts.head[0],
                high_water=facts.high,
                acks={seq: h for seq, (h, _) in facts.acks.items()},
                before=facts.before,
            )
            if mismatch.ok:
                raise AirlockError(ErrorCode.CONFLICT, "nothing to acknowledge: the journal matches every anchor")
            head_seq, head_hash = facts.head
            seq = max([facts.high, head_seq, *(a.seq for a in given)]) + 1
            payload = {
                "previous": {"seq": head_seq, "hash": head_hash},
                "high_water": facts.high,
                "contradicted": {"first_bad_seq": mismatch.first_bad_seq, "reason": mismatch.reason},
                "operator": operator,
                "uid": uid,
                "reason": reason,
            }
            normalized, text = _canonical_object("payload", payload, MAX_PAYLOAD_BYTES)
            when = iso_utc(clock())
            record = {
                "seq": seq,
                "time": when,
                "kind": chain.ACK_KIND,
                "request_id": None,
                "operation_id": None,
                "peer_uid": uid,
                "session": None,
                "writer": "journal",
                "payload": normalized,
                "prev_hash": head_hash,
            }
            digest = chain.compute_hash(record)
            conn.execute(
                f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (seq, when, chain.ACK_KIND, None, None, uid, None, "journal", text, head_hash, digest),
            )
            _raise_high(conn, seq)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise _unavailable(exc) from exc
    finally:
        conn.close()
    event = Event(seq, when, chain.ACK_KIND, None, None, uid, None, "journal", normalized, head_hash, digest)
    return Acknowledged(event, mismatch)


def validate_reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 1024:
        raise _invalid("an acknowledgement needs a reason of 1 to 1024 characters", "reason")
    return reason
