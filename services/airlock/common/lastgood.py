"""Last accepted copies: what a service runs on when the files on disk are refused (issue 44).

A service that accepts its configuration (or approval its policy) keeps the text it accepted in
its own StateDirectory; started later on files it refuses, it parses that copy instead of
exiting, so a typo never fails its sockets.  One small JSON file per copy, written whole
(temporary file, fsync, rename) and readable only by the service.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

MAX_BYTES = 8 * 1024 * 1024  # a policy is far smaller; a copy over this is not read


def save(directory: Path, name: str, files: list[dict[str, Any]]) -> None:
    """Keep ``files`` (each ``{"path", "text", ...}``) as the last accepted copy ``name``; raise OSError."""
    body = json.dumps({"v": 1, "accepted_at": time.time(), "files": files}, separators=(",", ":")).encode()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # systemd's StateDirectory= made it; dev up may not
    target = directory / name
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read(directory: Path, name: str) -> tuple[float, list[dict[str, Any]]] | None:
    """The copy ``name``: (when it was accepted, its files); None if there is none or it is unreadable."""
    try:
        fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as src:
        raw = src.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    files = body.get("files") if isinstance(body, dict) else None
    accepted = body.get("accepted_at") if isinstance(body, dict) else None
    if not isinstance(files, list) or not isinstance(accepted, int | float):
        return None
    if not all(
        isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("text"), str) for f in files
    ):
        return None
    return float(accepted), files
