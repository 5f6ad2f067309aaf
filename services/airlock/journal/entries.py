"""A journal record as a journald entry, and back.

airlock-journal sends every committed record to journald complete (one entry
per record, its fields ``AIRLOCK_*``), and its anchors as signed checkpoints;
a collector's copy is read back here, trusting an entry only if journald
stamped it as written by ``airlock-journal.service`` (journal/fleet.py checks
each host's chain from them).

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from airlock.common import checkpoint
from airlock.common.codec import canonical_json
from airlock.common.kinds import NOTICES
from airlock.journal import chain
from airlock.journal.chain import RECORD_FIELDS, Anchor

RECORD_MESSAGE_ID: Final = NOTICES["journal.record.appended"]
ANCHOR_MESSAGE_ID: Final = NOTICES["journal.chain.anchored"]
JOURNAL_UNIT: Final = "airlock-journal.service"
RECORD_EVENT: Final = "journal.record.appended"

_MACHINE_ID = re.compile(r"[0-9a-f]{32}")
_HOSTNAME = re.compile(r"[A-Za-z0-9_.-]{1,253}")


def host_identity(machine_id: str, hostname: str) -> str:
    """``<hostname>/<machine-id>`` from /etc/machine-id's text and the hostname."""
    mid = machine_id.strip().lower()
    if not _MACHINE_ID.fullmatch(mid):
        raise ValueError("a machine ID is 32 hexadecimal digits (see machine-id(5))")
    name = hostname.strip() or "localhost"
    if not _HOSTNAME.fullmatch(name):
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:253]
    return f"{name}/{mid}"


def host_matches(host: str, wanted: str) -> bool:
    """``--host`` names a host by its whole identity, its hostname or its machine ID."""
    name, _, mid = host.rpartition("/")
    return wanted in (host, name, mid)


def record_fields(record: Mapping[str, Any], digest: str, host: str) -> dict[str, str | bytes]:
    """The journald entry of one committed record (``record`` has every `RECORD_FIELDS` key)."""
    data = chain.record_bytes(record)
    fields: dict[str, str | bytes] = {
        "MESSAGE_ID": RECORD_MESSAGE_ID,
        "PRIORITY": "6",
        "AIRLOCK_EVENT": RECORD_EVENT,
        "AIRLOCK_SEQ": str(record["seq"]),
        "AIRLOCK_HASH": digest,
        "AIRLOCK_PREV_HASH": str(record["prev_hash"]),
        "AIRLOCK_KIND": str(record["kind"]),
        "AIRLOCK_HOST": host,
        "AIRLOCK_RECORD": data,
    }
    if record.get("request_id"):
        fields["AIRLOCK_REQUEST_ID"] = str(record["request_id"])
    return fields


def record_message(record: Mapping[str, Any]) -> str:
    return f"{RECORD_EVENT} seq={record['seq']} kind={record['kind']}"


# -- reading entries back ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shipped:
    """One record as a collector holds it, checked against its own fields."""

    host: str
    seq: int
    hash: str
    row: dict[str, Any]  # every RECORD_FIELDS key plus ``hash``: what `chain.verify_rows` takes


class Unusable(Exception):
    """An entry that cannot be a record: the message says why."""


def _text(entry: Mapping[str, Any], name: str) -> str:
    value = entry.get(name)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise Unusable(f"{name} is not UTF-8") from None
    if value is None:
        raise Unusable(f"{name} is missing")
    if isinstance(value, uuid.UUID):  # python3-systemd turns MESSAGE_ID and _BOOT_ID into UUIDs
        return value.hex
    return str(value)


def _raw(entry: Mapping[str, Any], name: str) -> bytes:
    value = entry.get(name)
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    raise Unusable(f"{name} is missing")


def trusted(entry: Mapping[str, Any], *, root_only: bool = False) -> bool:
    """Did journald see this entry come from airlock-journal -- or, with ``root_only``
    (an acknowledgement, written by `airlock audit acknowledge`), from root?"""
    if root_only:
        return _text_or_none(entry, "_UID") == "0"
    return _text_or_none(entry, "_SYSTEMD_UNIT") == JOURNAL_UNIT


def _text_or_none(entry: Mapping[str, Any], name: str) -> str | None:
    try:
        return _text(entry, name)
    except Unusable:
        return None


def parse_record(entry: Mapping[str, Any]) -> Shipped:
    """A record entry's checked content, or `Unusable`.

    ``AIRLOCK_RECORD`` must be canonical JSON of exactly `RECORD_FIELDS`, and
    ``AIRLOCK_SEQ``/``AIRLOCK_PREV_HASH``/``AIRLOCK_KIND`` must say what it says
    (so the fields people filter on cannot disagree with what was hashed).
    The hash itself is checked by `chain.verify_rows`.
    """
    host = _text(entry, "AIRLOCK_HOST")
    data = _raw(entry, "AIRLOCK_RECORD")
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        raise Unusable("AIRLOCK_RECORD is not JSON") from None
    if not isinstance(record, dict) or set(record) != set(RECORD_FIELDS):
        raise Unusable("AIRLOCK_RECORD does not hold exactly the record's fields")
    if canonical_json(record) != data:
        raise Unusable("AIRLOCK_RECORD is not in canonical form (not the bytes that were hashed)")
    seq = record["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise Unusable("the record's seq is not a positive integer")
    digest = _text(entry, "AIRLOCK_HASH")
    if not chain.is_hash(digest):
        raise Unusable(f"seq {seq}: AIRLOCK_HASH is not 64 lowercase hex digits")
    for name, value in (
        ("AIRLOCK_SEQ", str(seq)),
        ("AIRLOCK_PREV_HASH", record["prev_hash"]),
        ("AIRLOCK_KIND", record["kind"]),
    ):
        if _text(entry, name) != value:
            raise Unusable(f"seq {seq}: {name} disagrees with AIRLOCK_RECORD")
    return Shipped(host, seq, digest, dict(record, hash=digest))


@dataclass(frozen=True, slots=True)
class Signed:
    """A signed checkpoint as a collector holds it: what it says, its exact bytes, its signature."""

    checkpoint: checkpoint.Checkpoint
    statement: bytes
    signature: str


def parse_signed(entry: Mapping[str, Any]) -> Signed | None:
    """The signed checkpoint an anchor entry carries (``AIRLOCK_CHECKPOINT``, ``AIRLOCK_SIGNATURE``);
    None for an unsigned anchor, `Unusable` for one that does not say what its fields say."""
    statement = entry.get("AIRLOCK_CHECKPOINT")
    if statement is None:
        return None
    data = _raw(entry, "AIRLOCK_CHECKPOINT")
    signature = _text(entry, "AIRLOCK_SIGNATURE")
    try:
        made = checkpoint.parse(data)
    except ValueError as exc:
        raise Unusable(f"not a checkpoint: {exc}") from None
    if (_text_or_none(entry, "AIRLOCK_HOST"), _text_or_none(entry, "AIRLOCK_CHAIN_SEQ")) != (made.host, str(made.seq)):
        raise Unusable(f"checkpoint at seq {made.seq}: its fields disagree with what was signed")
    return Signed(made, data, signature)


def checkpoints_in(entries: Iterable[Mapping[str, Any]]) -> list[Signed]:
    """Every signed checkpoint among ``entries`` (once each), for the caller to check the signatures of."""
    found: dict[tuple[bytes, str], Signed] = {}
    for entry in entries:
        if _text_or_none(entry, "MESSAGE_ID") != ANCHOR_MESSAGE_ID:
            continue
        try:
            item = parse_signed(entry)
        except Unusable:
            continue
        if item is not None:
            found.setdefault((item.statement, item.signature), item)
    return list(found.values())


def parse_anchor(entry: Mapping[str, Any]) -> tuple[str | None, Anchor]:
    """(its AIRLOCK_HOST or None, the anchor) of an anchor entry, or `Unusable`."""
    host = _text_or_none(entry, "AIRLOCK_HOST")
    ack = (_text_or_none(entry, "AIRLOCK_CHAIN_ACK") or "").lower() == "true"
    try:
        return host, Anchor(int(_text(entry, "AIRLOCK_CHAIN_SEQ")), _text(entry, "AIRLOCK_CHAIN_HASH"), ack)
    except ValueError as exc:
        raise Unusable(f"not an anchor: {exc}") from None
