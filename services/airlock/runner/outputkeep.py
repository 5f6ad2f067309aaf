"""Output-log retention (issue 51): each requester's logs in a budget of their own, every deletion journaled.

One global byte budget, oldest first, let an agent's incompressible output
push every other agent's (and the root jobs') logs out.  So each log belongs
to a *group* named in its file name by the runner (runner/outputlog.py):
``u<uid>`` for jobs that ran as the requester ``uid`` itself, ``r<uid>`` for
root jobs that ``uid`` asked for (approved work keeps a budget the agent's
own output cannot touch); a log from before groups has the group ``""``.

`plan` (pure) decides, in this order:

1. ``age``: every log older than ``runner.output_log_max_age_seconds``;
2. ``agent_budget`` / ``root_budget``: in each group over its budget
   (``runner.output_log_agent_bytes``, ``runner.output_log_root_bytes``),
   that group's oldest until it fits;
3. ``total``: while all logs together take more than
   ``runner.output_log_total_bytes``, the oldest log of the group that
   takes the most, so a requester's own output is what goes first.

A running job's log counts but is never removed.  `KeptOutput` journals the
plan (``output_log.deleted``: each file, its group, size and why) before
`remove` unlinks anything: nothing is deleted unrecorded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from airlock.common.errors import AirlockError
from airlock.runner import outputlog

# One output_log.deleted record names at most this many files (each well under 200 bytes).
PER_RECORD = 200


@dataclass(frozen=True, slots=True)
class Entry:
    """One log on disk: its name, group, disk bytes, mtime, and whether its job still runs."""

    name: str
    group: str
    size: int
    mtime: float
    running: bool = False


@dataclass(frozen=True, slots=True)
class Budgets:
    max_age: float
    agent: int
    root: int
    total: int

    def of(self, group: str) -> int:
        return self.root if group.startswith("r") else self.agent


@dataclass(frozen=True, slots=True)
class Deletion:
    name: str
    group: str
    size: int
    reason: str  # age, agent_budget, root_budget, total

    def to_dict(self) -> dict[str, object]:
        return {"file": self.name, "group": self.group, "bytes": self.size, "reason": self.reason}


def plan(entries: Iterable[Entry], budgets: Budgets, now: float) -> list[Deletion]:
    """Which logs go, and why (see the module's order); pure."""
    usage: dict[str, int] = {}
    left: dict[str, list[Entry]] = {}  # each group's removable logs, oldest first
    for entry in sorted(entries, key=lambda e: (e.mtime, e.name)):
        usage[entry.group] = usage.get(entry.group, 0) + entry.size
        if not entry.running:
            left.setdefault(entry.group, []).append(entry)
    out: list[Deletion] = []

    def drop(group: str, reason: str) -> None:
        entry = left[group].pop(0)
        usage[group] -= entry.size
        out.append(Deletion(entry.name, group, entry.size, reason))

    for group, items in left.items():
        while items and now - items[0].mtime > budgets.max_age:
            drop(group, "age")
    for group, items in left.items():
        while items and usage[group] > budgets.of(group):
            drop(group, "root_budget" if group.startswith("r") else "agent_budget")
    while sum(usage.values()) > budgets.total:
        candidates = [g for g, items in left.items() if items]
        if not candidates:
            break
        drop(max(candidates, key=lambda g: (usage[g], g)), "total")
    return out


def scan(directory: Path, running: frozenset[str]) -> list[Entry]:
    """Every output log in ``directory`` (disk blocks, mtime); nothing else there counts."""
    try:
        dirfd = outputlog.open_dir(directory)
    except (OSError, AirlockError):
        return []
    entries = []
    try:
        for name in os.listdir(dirfd):
            if not outputlog.valid_name(name):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                size = st.st_blocks * 512 or st.st_size
                entries.append(Entry(name, outputlog.group_of(name), size, st.st_mtime, name in running))
    finally:
        os.close(dirfd)
    return entries


def remove(directory: Path, names: Iterable[str]) -> list[str]:
    """Unlink these logs (relative to the directory's fd); the names removed."""
    dirfd = outputlog.open_dir(directory)
    removed = []
    try:
        for name in names:
            if outputlog.valid_name(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dirfd)
                    removed.append(name)
    finally:
        os.close(dirfd)
    return removed
