"""The journal's records and the checks a value passes before it is stored.

`Event` (one chained audit record), `EventsPage` (one page of the events
feed) and `Stats` (writer counters); the caps on payloads and outcomes; and
the validators that turn a caller's payload into the canonical JSON that is
hashed and stored.  No SQL here: `journal/schema.py` holds the tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from airlock.common.codec import canonical_json, reject_constant
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.kinds import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES  # re-exported: the journal's cap
from airlock.common.wire.journal import MAX_OUTCOME_BYTES as MAX_OUTCOME_BYTES  # re-exported: the journal's cap
from airlock.journal.operations import MAX_ID_CHARS

MAX_PAGE: Final = 256
MAX_UID: Final = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Event:
    """One audit record as stored and chained."""

    seq: int
    time: str
    kind: str
    request_id: str | None
    operation_id: str | None
    peer_uid: int | None
    session: str | None
    writer: str
    payload: dict[str, Any]
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "kind": self.kind,
            "request_id": self.request_id,
            "operation_id": self.operation_id,
            "peer_uid": self.peer_uid,
            "session": self.session,
            "writer": self.writer,
            "payload": self.payload,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }


@dataclass(frozen=True, slots=True)
class EventsPage:
    """One page of the events feed (reference/004)."""

    events: list[Event]
    next_cursor: int
    latest: int

    def to_dict(self) -> dict[str, Any]:
        return {"events": [e.to_dict() for e in self.events], "next_cursor": self.next_cursor, "latest": self.latest}


@dataclass(frozen=True, slots=True)
class Stats:
    """Writer counters since open: ``transactions`` < ``appends`` is group commit at work."""

    transactions: int
    appends: int
    operations: int
    failed_transactions: int
    largest_batch: int


def _event(row: tuple[Any, ...]) -> Event:
    payload = json.loads(row[8])
    return Event(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], payload, row[9], row[10])


def _canonical_object(name: str, value: object, cap: int) -> tuple[dict[str, Any], str]:
    """The object as it will be hashed and stored, and its canonical text.

    Round-tripping through canonical JSON means what is hashed now is exactly
    what `verify` will parse back later (tuples become lists, keys strings).
    """
    if not isinstance(value, dict):
        raise _invalid(f"{name} must be an object", name)
    try:
        data = canonical_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _invalid(f"{name} is not JSON-serialisable: {str(exc)[:200]}", name) from None
    if len(data) > cap:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{name} is {len(data)} bytes of canonical JSON; the limit is {cap}",
            {"field": name, "limit_bytes": cap},
        )
    try:
        normalized = json.loads(data, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise _invalid(f"{name} holds a value JSON cannot carry (NaN or infinity)", name) from None
    if normalized == value:
        # Already JSON's own shape (string keys, lists, no tuples): what was parsed back is what was
        # encoded, so the encoding is already the canonical text of ``normalized``; encoding it a
        # second time cost every record of every exec a third JSON pass (issue 50).
        return normalized, data.decode()
    text = canonical_json(normalized).decode()
    return normalized, text


def _optional_text(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        raise _invalid(f"{name} must be a string of 1 to {MAX_ID_CHARS} characters", name)
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _invalid(f"{name} is not valid Unicode", name) from None
    return value


def _optional_uid(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UID:
        raise _invalid("peer_uid must be an integer from 0 to 2^32-1", "peer_uid")
    return value


def _invalid(message: str, field: str) -> AirlockError:
    return AirlockError(ErrorCode.INVALID_ARGUMENTS, message, {"field": field})


def _unavailable(exc: BaseException) -> AirlockError:
    return AirlockError(ErrorCode.AUDIT_UNAVAILABLE, f"the audit journal could not commit: {str(exc)[:200]}")
