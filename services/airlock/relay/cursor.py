"""A channel's durable cursor: the seq of the last event it delivered.

One small JSON file per channel in the relay's state directory, replaced
atomically (written to a temporary file, fsync'd, renamed over the old one,
the directory fsync'd), so a crash or SIGKILL at any instant leaves either the
old or the new cursor, never a torn one.  At least once: the cursor moves only
after the receiver accepted the message, so what was in flight is sent again.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class CursorError(Exception):
    """The cursor file exists but cannot be read: never guess (a guess could skip events)."""


def path_for(state_dir: Path, channel: str) -> Path:
    if not _NAME.fullmatch(channel):
        raise ValueError(f"channel name {channel!r} is not a safe file name")
    return state_dir / f"cursor-{channel}.json"


def load(path: Path) -> int | None:
    """The saved seq, or None when there is no cursor yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CursorError(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(4096)
    try:
        seq = json.loads(data)["seq"]
    except (ValueError, KeyError, TypeError):
        raise CursorError(f"{path}: not a cursor file; remove it to start from the newest event") from None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise CursorError(f"{path}: not a cursor file; remove it to start from the newest event")
    return seq


def save(path: Path, seq: int) -> None:
    """Replace the cursor with ``seq``, durably."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps({"seq": seq}).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
