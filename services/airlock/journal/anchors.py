"""Where the chain's anchors live outside the database: a file and journald.

The anchors file sits beside the database (``journal.anchors`` in the state
folder): one JSON object a line, ``{"seq":…, "hash":…, "time":…, "reason":…}``
(and ``"ack": true`` for an acknowledgement's anchor), appended with
``O_APPEND`` and fsynced before the write returns.  The journal writes it in
every mode and checks its newest line at start.  Under systemd each anchor is
also a journald entry with its own ``MESSAGE_ID`` and ``AIRLOCK_CHAIN_SEQ``/
``AIRLOCK_CHAIN_HASH`` fields (see `airlock.common.kinds.NOTICES`), which
whoever can write the database cannot take back.

The comparison itself is pure (`airlock.journal.chain.check_anchors`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from airlock.common.codec import iso_utc
from airlock.common.kinds import NOTICES
from airlock.journal.chain import Anchor, parse_anchor_lines

FILE_NAME: Final = "journal.anchors"
ANCHOR_MESSAGE_ID: Final = NOTICES["journal.chain.anchored"]
# The newest anchor is in the last few lines; a start reads no more than this.
_TAIL_BYTES: Final = 64 * 1024


def path_beside(database: Path) -> Path:
    """The anchors file of the journal database ``database``."""
    return Path(database).with_name(FILE_NAME)


def line(anchor: Anchor, reason: str, when: float, extra: dict[str, Any] | None = None) -> bytes:
    """One line of the anchors file; ``extra``: a signed checkpoint's ``checkpoint`` and ``signature``."""
    moment = iso_utc(when)
    fields = anchor.to_dict() | {"time": moment, "reason": reason} | (extra or {})
    return (json.dumps(fields, separators=(",", ":")) + "\n").encode()


def append(
    path: Path,
    anchor: Anchor,
    reason: str,
    when: float,
    *,
    owner: tuple[int, int] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Append one anchor line and fsync it (creating the file 0600).

    ``owner``: when running as root (an acknowledgement), hand a file this
    call created to the journal's user, so the journal can go on appending.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if owner is not None and os.geteuid() == 0:
            os.fchown(fd, *owner)
        data = line(anchor, reason, when, extra)
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: Path) -> tuple[list[Anchor], int]:
    """Every anchor in the file and the number of unreadable lines; ``([], 0)`` if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return [], 0
    with os.fdopen(fd, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    return parse_anchor_lines(text)


def last_in_file(path: Path) -> Anchor | None:
    """The newest anchor in the file (reads only its tail)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - _TAIL_BYTES)
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    if start > 0:
        text = text.partition("\n")[2]  # the first line may be cut
    anchors, _ = parse_anchor_lines(text)
    return anchors[-1] if anchors else None


def journald_fields(anchor: Anchor, reason: str) -> dict[str, Any]:
    """The structured log fields of an anchor (``chain_seq`` becomes ``AIRLOCK_CHAIN_SEQ``)."""
    return {
        "message_id": ANCHOR_MESSAGE_ID,
        "chain_seq": anchor.seq,
        "chain_hash": anchor.hash,
        "chain_ack": True if anchor.ack else None,
        "reason": reason,
    }


def send_journald(anchor: Anchor, reason: str, *, host: str | None = None) -> bool:
    """Send an anchor straight to journald (for `airlock audit acknowledge`); False without journald."""
    try:
        from systemd import journal
    except ImportError:
        return False
    fields = {
        "MESSAGE_ID": ANCHOR_MESSAGE_ID,
        "AIRLOCK_EVENT": "journal.chain.anchored",
        "AIRLOCK_CHAIN_SEQ": str(anchor.seq),
        "AIRLOCK_CHAIN_HASH": anchor.hash,
        "AIRLOCK_REASON": reason,
        "PRIORITY": "6",
        "SYSLOG_IDENTIFIER": "airlock",
    }
    if anchor.ack:
        fields["AIRLOCK_CHAIN_ACK"] = "true"
    if host is not None:
        fields["AIRLOCK_HOST"] = host
    try:
        journal.send(f"journal.chain.anchored chain_seq={anchor.seq} chain_hash={anchor.hash}", **fields)
    except OSError:
        return False
    return True


class JournaldUnavailable(Exception):
    """journald's anchors cannot be read here (no python3-systemd, or no journal)."""


JOURNAL_UNIT: Final = "airlock-journal.service"


def read_journald(writer_uids: Iterable[int]) -> list[Anchor]:
    """Every anchor in journald that airlock-journal or root wrote.

    Anyone can send a journald entry with any ``MESSAGE_ID``; only the fields
    journald sets itself (``_UID``, ``_SYSTEMD_UNIT``) say who did.  An anchor
    counts from ``airlock-journal.service`` running as one of ``writer_uids``;
    an ack anchor only from root (``airlock audit acknowledge``): the
    journal's own user cannot excuse a mismatch.
    """
    try:
        from systemd import journal
    except ImportError as exc:
        raise JournaldUnavailable("python3-systemd is not installed") from exc
    allowed = set(writer_uids)
    found: list[Anchor] = []
    try:
        reader = journal.Reader()
    except OSError as exc:
        raise JournaldUnavailable(f"cannot open the journal: {exc}") from exc
    try:
        reader.add_match(MESSAGE_ID=ANCHOR_MESSAGE_ID)
        for entry in reader:
            uid = entry.get("_UID")
            if not isinstance(uid, int) or uid not in allowed:
                continue
            ack = str(entry.get("AIRLOCK_CHAIN_ACK", "")).lower() == "true"
            if (uid != 0) if ack else (entry.get("_SYSTEMD_UNIT") != JOURNAL_UNIT):
                continue
            try:
                found.append(
                    Anchor(int(str(entry.get("AIRLOCK_CHAIN_SEQ"))), str(entry.get("AIRLOCK_CHAIN_HASH")), ack)
                )
            except ValueError:
                continue
    finally:
        reader.close()
    return found
