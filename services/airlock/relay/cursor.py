"""A channel's durable cursor: how far into which journal it has handled events.

One small JSON file per channel in the relay's state directory, replaced
atomically (written to a temporary file, fsync'd, renamed over the old one,
the directory fsync'd), so a crash or SIGKILL at any instant leaves either the
old or the new cursor, never a torn one.  At least once: the cursor moves only
after the receiver accepted the message, so what was in flight is sent again.

``seq``: every event up to it is handled (delivered, dropped, or made no
message).  ``done``: events after ``seq`` already delivered (the relay serves
agents in turn, so it does not deliver in seq order; these are not sent
again after a restart).  ``journal``: the journal the seqs belong to, the hash
of its first record (issue 28): a purged and reinstalled journal starts again
at seq 1, and a cursor of the old one would skip its events.  ``delivered``
and ``delivered_at``: the last event the receiver took, and when (what
`airlock status` shows): kept here so a restarted relay (an upgrade, a
reinstall) does not claim it never delivered anything (issue 44).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HASH = re.compile(r"[0-9a-f]{64}")
MAX_BYTES = 256 * 1024  # a cursor with its `done` list (bounded by the relay's read-ahead)


@dataclass(frozen=True)
class Cursor:
    seq: int
    journal: str | None = None  # the journal's first record's hash; None: not known (an empty journal, an old file)
    done: frozenset[int] = field(default_factory=frozenset)
    delivered: int | None = None  # the last event delivered to the receiver (for `airlock status`)
    delivered_at: str | None = None


class CursorError(Exception):
    """The cursor file exists but cannot be read: never guess (a guess could skip events)."""


def path_for(state_dir: Path, channel: str) -> Path:
    if not _NAME.fullmatch(channel):
        raise ValueError(f"channel name {channel!r} is not a safe file name")
    return state_dir / f"cursor-{channel}.json"


def load(path: Path) -> Cursor | None:
    """The saved cursor, or None when there is none yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CursorError(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    bad = CursorError(f"{path}: not a cursor file; remove it to start from the newest event")
    try:
        raw = json.loads(data)
        seq, journal, done = raw["seq"], raw.get("journal"), raw.get("done", [])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise bad from None
    if len(data) > MAX_BYTES or not _seq(seq) or not isinstance(done, list) or not all(_seq(d) for d in done):
        raise bad
    if journal is not None and not (isinstance(journal, str) and _HASH.fullmatch(journal)):
        raise bad
    # Shown to operators only: a value that is not one is dropped, never trusted.
    delivered, delivered_at = raw.get("delivered"), raw.get("delivered_at")
    if not _seq(delivered) or not isinstance(delivered_at, str) or len(delivered_at) > 64:
        delivered, delivered_at = None, None
    return Cursor(seq, journal, frozenset(d for d in done if d > seq), delivered, delivered_at)


def _seq(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def save(path: Path, cursor: Cursor) -> None:
    """Replace the cursor, durably."""
    body = {
        "seq": cursor.seq,
        "journal": cursor.journal,
        "done": sorted(d for d in cursor.done if d > cursor.seq),
        "delivered": cursor.delivered,
        "delivered_at": cursor.delivered_at,
    }
    write_atomically(path, json.dumps(body).encode() + b"\n", 0o600)


def write_atomically(path: Path, data: bytes, mode: int, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (mode ``mode``): the old or the new file after a crash, never a torn one.

    ``durable=False`` skips the fsyncs (a file rewritten every few seconds that a crash may set back)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
