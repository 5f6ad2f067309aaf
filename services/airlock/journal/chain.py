"""The hash chain: canonical records, their hashes, and verification.

Each event's ``hash`` is ``sha256(bytes.fromhex(prev_hash) + canonical(record))``
in hex, where ``record`` is every field of the event except ``hash`` (so
``prev_hash`` and ``seq`` are covered too) and ``canonical`` is
`airlock.common.codec.canonical_json`.  The first event's ``prev_hash`` is
`GENESIS`.

What the chain proves and what it does not: editing, deleting, inserting or
reordering a row anywhere before the newest is evident.  Cutting rows off the
end, or rewriting a row *and every row after it*, is not evident from the
database alone; that is what anchors are for.  The journal writes its head
(seq, hash) outside the database -- to journald and to an anchors file --
at start, at stop and every so many records or seconds, and `check_anchors`
compares the database with every anchor found.  The database also keeps a
high-water mark (the highest seq ever written) so cut-off rows are missed
even before the next anchor.

A mismatch an operator has looked at is acknowledged with a
``chain.acknowledged`` record (`ACK_KIND`): it links to the last record left
(its ``prev_hash``), takes the next seq above everything ever written or
anchored, and starts a new segment; its own anchor is marked ``ack``.  The
only seq gap `verify_rows` accepts is right before such a record.

Pure: no I/O, so `airlock audit verify`, the journal and the tests share it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from airlock.common.codec import canonical_json

GENESIS: Final = "0" * 64

# The fields a record is made of, in the order they appear in exports.  The
# canonical form sorts keys, so this order does not affect hashes.
RECORD_FIELDS: Final = (
    "seq",
    "time",
    "kind",
    "request_id",
    "operation_id",
    "peer_uid",
    "session",
    "writer",
    "payload",
    "prev_hash",
)

_HASH = re.compile(r"[0-9a-f]{64}")

# The record that starts a new chain segment after an acknowledged mismatch.
ACK_KIND: Final = "chain.acknowledged"


def is_hash(value: object) -> bool:
    return isinstance(value, str) and _HASH.fullmatch(value) is not None


def record_bytes(record: Mapping[str, Any]) -> bytes:
    """The canonical bytes of a record: exactly `RECORD_FIELDS`, nothing else."""
    return canonical_json({name: record[name] for name in RECORD_FIELDS})


def compute_hash_with(record: Mapping[str, Any], payload_text: str) -> str:
    """`compute_hash`, with the payload given as its canonical text (encoded once, by the store).

    The record's other fields are encoded with ``"payload": null`` and the
    text put in its place: the same bytes `record_bytes` gives (a string
    value cannot hold the unescaped ``"payload":null``, so the key is the
    only match).
    """
    prev = record["prev_hash"]
    if not is_hash(prev):
        raise ValueError("prev_hash must be 64 lowercase hex digits")
    skeleton = canonical_json({name: (None if name == "payload" else record[name]) for name in RECORD_FIELDS})
    head, found, tail = skeleton.partition(b'"payload":null')
    if not found:
        raise ValueError("the record has no payload field")
    digest = hashlib.sha256(bytes.fromhex(prev))
    digest.update(head + b'"payload":' + payload_text.encode() + tail)
    return digest.hexdigest()


def compute_hash(record: Mapping[str, Any]) -> str:
    """``sha256(prev_hash as 32 raw bytes + canonical record)`` in lowercase hex."""
    prev = record["prev_hash"]
    if not is_hash(prev):
        raise ValueError("prev_hash must be 64 lowercase hex digits")
    digest = hashlib.sha256(bytes.fromhex(prev))
    digest.update(record_bytes(record))
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The outcome of checking a run of the chain.

    ``head_seq``/``head_hash`` are the newest record that checked out (the
    journal's head when ``ok``; the last good record before ``first_bad_seq``
    otherwise; ``(0, GENESIS)`` when nothing did).
    """

    ok: bool
    checked: int
    first_bad_seq: int | None
    reason: str | None
    head_seq: int
    head_hash: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
        }


class _Bad(Exception):
    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(reason)
        self.seq = seq
        self.reason = reason


def _normalize(row: Mapping[str, Any], expected_seq: int) -> dict[str, Any]:
    """The record as it was hashed, or `_Bad` if the row cannot be one."""
    try:
        record = {name: row[name] for name in RECORD_FIELDS}
        stored_hash = row["hash"]
    except KeyError as exc:
        raise _Bad(expected_seq, f"row is missing field {exc.args[0]!r}") from None
    seq = record["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise _Bad(expected_seq, "seq is not an integer")
    payload = record["payload"]
    if isinstance(payload, (str, bytes)):
        # Straight from the database: the stored text must be the canonical
        # form, so even a meaning-preserving edit of the bytes shows.
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
        try:
            parsed = json.loads(text)
            canonical = canonical_json(parsed)
        except (ValueError, RecursionError):
            raise _Bad(seq, "payload is not valid JSON") from None
        if canonical != text.encode("utf-8", "surrogatepass"):
            raise _Bad(seq, "payload is not in canonical form")
        record["payload"] = parsed
    if not isinstance(record["payload"], dict):
        raise _Bad(seq, "payload is not an object")
    if not is_hash(stored_hash) or not is_hash(record["prev_hash"]):
        raise _Bad(seq, "hash or prev_hash is not 64 lowercase hex digits")
    record["hash"] = stored_hash
    return record


def verify_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    from_seq: int | None = None,
    anchor: str | None = None,
    prev_hash: str | None = None,
) -> VerifyResult:
    """Check a run of records in storage order and name the first bad one.

    ``rows`` are mappings with every `RECORD_FIELDS` key plus ``hash``;
    ``payload`` may be a dict or its stored canonical JSON text.

    - Without ``from_seq`` the run must start at seq 1 from `GENESIS`.
    - With ``from_seq`` the run must start at that seq; its ``prev_hash`` is
      taken on trust unless ``prev_hash`` is given (a start point: the hash
      of the record before, e.g. the previous segment's last) or ``anchor``
      is given, in which case the record at ``from_seq`` must have exactly
      that hash (an anchor is a head kept off the host: ``airlock audit
      head``).  A missing anchor record means the journal was cut short.

    A missing seq (deleted row) is reported as that seq; a row whose
    ``prev_hash`` does not match its predecessor (deleted and renumbered, or
    reordered) or whose own hash does not match its content (edited) is
    reported as that row's seq.

    This is the reference; `verify_stored` gives the same answer faster for
    rows straight from the database.
    """
    walk = _Walk(from_seq, anchor, prev_hash)
    for row in rows:
        bad = walk.check(row)
        if bad is not None:
            return bad
    return walk.end()


class _Walk:
    """`verify_rows`'s state between records, so the fast path can hand single rows to it."""

    __slots__ = ("anchor", "checked", "expected", "from_seq", "head_hash", "head_seq", "prev")

    def __init__(self, from_seq: int | None, anchor: str | None, prev_hash: str | None) -> None:
        if anchor is not None and from_seq is None:
            raise ValueError("an anchor needs from_seq: it is the hash of the record at that seq")
        if anchor is not None and not is_hash(anchor):
            raise ValueError("anchor must be 64 lowercase hex digits")
        if from_seq is not None and from_seq < 1:
            raise ValueError("from_seq must be at least 1")
        if prev_hash is not None and not is_hash(prev_hash):
            raise ValueError("prev_hash must be 64 lowercase hex digits")
        self.from_seq = from_seq
        self.anchor = anchor
        self.expected = 1 if from_seq is None else from_seq
        self.prev: str | None = prev_hash if prev_hash is not None else (GENESIS if from_seq is None else None)
        self.head_seq, self.head_hash = 0, GENESIS
        self.checked = 0

    def bad(self, seq: int, reason: str) -> VerifyResult:
        return VerifyResult(False, self.checked, seq, reason, self.head_seq, self.head_hash)

    def check(self, row: Mapping[str, Any]) -> VerifyResult | None:
        """Take one row: None if it checks out, else the result naming it."""
        expected, prev = self.expected, self.prev
        try:
            record = _normalize(row, expected)
        except _Bad as exc:
            return self.bad(exc.seq, exc.reason)
        seq = record["seq"]
        # An acknowledged cut may skip seqs; the prev_hash link below must still hold.
        if seq > expected and not (record["kind"] == ACK_KIND and prev is not None):
            return self.bad(expected, f"seq {expected} is missing (next record is seq {seq})")
        if seq < expected:
            return self.bad(seq, f"seq {seq} is out of order (expected seq {expected})")
        if prev is not None and record["prev_hash"] != prev:
            return self.bad(seq, f"seq {seq}: prev_hash does not match the hash of the record before it")
        try:
            actual = compute_hash(record)
        except (TypeError, ValueError) as exc:
            return self.bad(seq, f"seq {seq}: record cannot be hashed ({exc})")
        if actual != record["hash"]:
            return self.bad(seq, f"seq {seq}: hash does not match the record's content")
        if self.anchor is not None and seq == self.from_seq and actual != self.anchor:
            return self.bad(seq, f"seq {seq}: hash does not match the anchor")
        self.checked += 1
        self.head_seq, self.head_hash = seq, actual
        self.prev = actual
        self.expected = seq + 1
        return None

    def end(self) -> VerifyResult:
        if self.anchor is not None and self.checked == 0:
            assert self.from_seq is not None
            return self.bad(self.from_seq, f"anchor record seq {self.from_seq} is missing: the journal ends before it")
        return VerifyResult(True, self.checked, None, None, self.head_seq, self.head_hash)


# -- anchors ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Anchor:
    """A chain head written outside the database: the record at ``seq`` had ``hash``.

    ``ack`` marks the anchor of an acknowledgement record (a new segment).
    """

    seq: int
    hash: str
    ack: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.seq, bool) or not isinstance(self.seq, int) or self.seq < 1:
            raise ValueError("an anchor's seq must be a positive integer")
        if not is_hash(self.hash):
            raise ValueError("an anchor's hash must be 64 lowercase hex digits")

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash} | ({"ack": True} if self.ack else {})


def parse_anchor(value: object) -> Anchor:
    """An anchor from one decoded JSON line of an anchors file, or `ValueError`."""
    if not isinstance(value, dict):
        raise ValueError("an anchor is a JSON object")
    ack = value.get("ack", False)
    if not isinstance(ack, bool):
        raise ValueError("an anchor's ack must be true or false")
    return Anchor(value.get("seq"), value.get("hash"), ack)  # type: ignore[arg-type]


def parse_anchor_lines(text: str) -> tuple[list[Anchor], int]:
    """The anchors of an anchors file's text, and how many lines were not anchors.

    A last line without its newline is a write cut short by a crash: it is
    neither an anchor nor counted as unreadable.
    """
    lines = text.split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]  # torn tail
    anchors: list[Anchor] = []
    unreadable = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            anchors.append(parse_anchor(json.loads(line)))
        except (ValueError, RecursionError):
            unreadable += 1
    return anchors, unreadable


@dataclass(frozen=True, slots=True)
class AnchorCheck:
    """How the database compares with a set of anchors.

    ``checked`` anchors matched or were compared; ``acknowledged`` anchors were
    older than a confirmed acknowledgement (a segment boundary) and so not
    held against the database.  ``first_bad_seq`` is the lowest seq found bad.
    """

    ok: bool
    checked: int
    acknowledged: int
    first_bad_seq: int | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "acknowledged": self.acknowledged,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
        }


def check_anchors(
    anchors: Iterable[Anchor],
    *,
    stored: Mapping[int, str],
    head_seq: int,
    high_water: int,
    acks: Mapping[int, str],
    before: Mapping[int, int] | None = None,
) -> AnchorCheck:
    """Compare the database with anchors kept outside it.

    - ``stored``: the database's hash at (at least) every anchored seq it holds;
    - ``head_seq``: its newest record; ``high_water``: the highest seq it ever wrote;
    - ``acks``: seq -> hash of its acknowledgement records;
    - ``before``: for an anchored seq it lacks, the newest seq it holds below
      it (so a gap is reported from its start).

    An acknowledgement counts only if the anchors hold its own ack anchor
    (same seq and hash): a record an intruder adds to the database does not
    excuse anything.  An ack anchor serves only to confirm: one that matches
    no acknowledgement here is not compared (a missing acknowledgement shows
    at the anchors written after it).  Anchors below the newest confirmed
    acknowledgement are ``acknowledged``; every other anchor must match the
    record at its seq.
    Reported, with the first bad seq:

    - a high-water mark above the head (the newest records were deleted);
    - an anchor beyond the head (the journal was cut short);
    - an anchored record that is missing or has another hash (rewritten,
      with every later hash recomputed, or cut and written again).
    """
    items = sorted(set(anchors), key=lambda a: (a.seq, a.hash, a.ack))
    confirmed = [a.seq for a in items if a.ack and acks.get(a.seq) == a.hash]
    boundary = max(confirmed, default=0)
    problems: list[tuple[int, str]] = []
    if high_water > head_seq:
        problems.append((head_seq + 1, f"records {head_seq + 1} to {high_water} were written and are gone"))
    checked = acknowledged = 0
    last_good = 0
    for anchor in items:
        if anchor.ack and acks.get(anchor.seq) != anchor.hash:
            continue
        if anchor.seq < boundary:
            acknowledged += 1
            continue
        checked += 1
        actual = stored.get(anchor.seq)
        if anchor.seq > head_seq:
            problems.append(
                (
                    head_seq + 1,
                    f"an anchor names seq {anchor.seq} but the journal ends at seq "
                    f"{head_seq}: records after {head_seq} are gone",
                )
            )
        elif actual is None:
            start = (before or {}).get(anchor.seq, anchor.seq - 1) + 1
            problems.append((start, f"seq {anchor.seq} is anchored but missing (records from seq {start} are gone)"))
        elif actual != anchor.hash:
            problems.append(
                (
                    anchor.seq,
                    f"seq {anchor.seq}: hash differs from its anchor (a record after "
                    f"seq {last_good}, the last that matched, was rewritten)",
                )
            )
        else:
            last_good = max(last_good, anchor.seq)
    if not problems:
        return AnchorCheck(True, checked, acknowledged, None, None)
    first = min(problems)
    return AnchorCheck(False, checked, acknowledged, first[0], first[1])
