"""Retention of sealed audit segments: to the archive, and -- only when a condition holds -- deleted (issue 38).

Two steps, run by airlock-journal after every rollover, at start and hourly:

1. **Archive.**  A sealed segment in ``segments/`` that was sealed
   ``journal.retention_max_age`` seconds ago, or the oldest ones while
   ``segments/`` holds more than ``journal.retention_max_bytes``, moves to
   the archive folder (``journal.archive_dir``; a rename, or a copy, fsync and
   unlink across filesystems).  Moving deletes nothing: verify finds it there.
2. **Delete.**  An archived segment past the archive's own limits
   (``journal.archive_max_age``, ``journal.archive_max_bytes``) is deleted
   only when ``journal.archive_delete_when`` holds for it:

   - ``never`` (the default): it stays; the journal logs
     ``journal.archive.over_limit`` so the operator knows;
   - ``confirmed``: an operator ran ``airlock audit archive --confirm``
     (deletes what is past the limits at that moment);
   - ``shipped``: its last record is at or below the *shipped mark*, the
     newest record a collector holds for this host (``airlock audit archive
     --shipped SEQ:HASH``, what ``airlock fleet verify`` on the collector
     reported; the journal checks the hash against its own record before it
     keeps the mark in ``journal.shipped``).

   Each deletion is first journaled in the live chain (``segment.deleted``:
   the segment's number, first and last seq and final hash), then the file
   is unlinked: the live chain still proves what came before, and ``verify
   --full`` accepts exactly that gap.  Oldest first, never a segment newer
   than one kept (the history stays one run).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from airlock.journal import segments
from airlock.journal.segments import SegmentInfo

SHIPPED_FILE: Final = "journal.shipped"
WHEN: Final = ("never", "shipped", "confirmed")


@dataclass(frozen=True, slots=True)
class Limits:
    retention_max_age: float = 0.0
    retention_max_bytes: int = 0
    archive_max_age: float = 0.0
    archive_max_bytes: int = 0
    delete_when: str = "never"


def _age(info: SegmentInfo, now: float) -> float:
    try:
        sealed = datetime.fromisoformat(info.sealed_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return now - sealed


def past(infos: list[SegmentInfo], max_age: float, max_bytes: int, now: float) -> list[SegmentInfo]:
    """The oldest segments past an age or a total size (a prefix of ``infos``, which are oldest first)."""
    total = sum(i.size for i in infos)
    out = []
    for info in infos:
        over_age = max_age > 0 and _age(info, now) >= max_age
        over_size = max_bytes > 0 and total > max_bytes
        if not (over_age or over_size):
            break
        out.append(info)
        total -= info.size
    return out


def move(info: SegmentInfo, folder: Path) -> Path:
    """Move a sealed file into ``folder`` (created 0700), durably; its new path."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = folder / info.path.name
    if target.exists():
        raise OSError(f"{target} exists already")
    try:
        os.rename(info.path, target)
    except OSError as exc:
        if exc.errno != 18:  # EXDEV: another filesystem
            raise
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(info.path, partial)
        fd = os.open(partial, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(partial, 0o440)
        os.rename(partial, target)
        os.unlink(info.path)
    for d in {folder, info.path.parent}:
        segments._fsync_dir(d)
    return target


def read_shipped(database: Path) -> tuple[int, str] | None:
    """The shipped mark (seq, hash) kept beside the database, or None."""
    try:
        data = json.loads(database.with_name(SHIPPED_FILE).read_text())
        return int(data["seq"]), str(data["hash"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_shipped(database: Path, seq: int, digest: str) -> None:
    path = database.with_name(SHIPPED_FILE)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps({"seq": seq, "hash": digest}).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


Journaler = Callable[[dict[str, Any]], Awaitable[None]]


async def apply(
    database: Path,
    archive: Path,
    limits: Limits,
    now: float,
    journal_deletion: Journaler,
    *,
    confirmed: bool = False,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Both steps; what was archived, deleted, and what is past the limits but kept (and why)."""
    report: dict[str, Any] = {"archived": [], "deleted": [], "kept": [], "delete_when": limits.delete_when}
    # File work runs off the event loop (a thread each): the journal keeps serving meanwhile.
    live = await asyncio.to_thread(segments.scan, segments.segments_dir(database))
    for info in past(live, limits.retention_max_age, limits.retention_max_bytes, now):
        report["archived"].append(info.to_dict() | {"to": str(archive / info.path.name)})
        if not dry_run:
            await asyncio.to_thread(move, info, archive)
    archived = await asyncio.to_thread(segments.scan, archive)
    candidates = past(archived, limits.archive_max_age, limits.archive_max_bytes, now)
    shipped = await asyncio.to_thread(read_shipped, database)
    holding = False  # once one is kept, every newer one is too: what is deleted stays the oldest run
    for info in candidates:
        if holding:
            report["kept"].append(info.to_dict() | {"why": "an older segment is kept"})
            continue
        if limits.delete_when == "confirmed" and confirmed:
            reason = "confirmed"
        elif limits.delete_when == "shipped" and shipped is not None and info.last_seq <= shipped[0]:
            reason = "shipped"
        else:
            why = {
                "never": "journal.archive_delete_when is never",
                "confirmed": "waits for `airlock audit archive --confirm`",
                "shipped": "not shipped yet (no shipped mark at or above its last record)",
            }[limits.delete_when]
            report["kept"].append(info.to_dict() | {"why": why})
            holding = True
            continue
        entry = info.to_dict() | {"reason": reason}
        if not dry_run:
            # Journaled first: if the unlink fails the file is still there and still verifies.
            await journal_deletion(
                {
                    "segment": info.number,
                    "file": info.path.name,
                    "first_seq": info.first_seq,
                    "last_seq": info.last_seq,
                    "final_hash": info.final_hash,
                    "bytes": info.size,
                    "reason": reason,
                }
            )
            await asyncio.to_thread(_unlink, info.path)
        report["deleted"].append(entry)
    return report


def _unlink(path: Path) -> None:
    os.unlink(path)
    segments._fsync_dir(path.parent)
