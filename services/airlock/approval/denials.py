"""What people denied, remembered by what would run, not by how it was spelled (issue 45).

A person's denial is keyed by its `Meaning`: the requester, the run-as
uid, and for each stage the canonical binary (its path, and the device and
inode the ticket binds) with the argument list; for a file operation the
tool and the canonical path.  ``id -u``, ``/usr/bin/id -u`` and a symlink to
``/usr/bin/id`` are one meaning; the cwd, the environment and stdin are not
part of it, so a denial covers the same command asked from anywhere (a
broader match only sends more to people).  A stage matches by path or by
identity, so a hard link or a renamed copy of the same file is covered too.

`DenialMemory` keeps every denial for ``approval.denial_memory_seconds``
(no count cap: only people add to it), and says "denied" for everything
until its denials are known (read back from the journal at start,
approval/restore.py): a grant or a reviewer then allows nothing.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# approval.decided's ``by`` values that are no person's decision (a reviewer's is ``reviewer NAME``).
NOT_A_PERSON = frozenset({"policy", "grant", "timeout", "agent", "shutdown"})

# One stage: (canonical path, device, inode, arguments); device and inode -1 when not bound.
Stage = tuple[str, int, int, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Meaning:
    """What a request would run, as a person's denial is remembered."""

    uid: int  # the requester (agent's peer uid)
    run_as: int
    stages: tuple[Stage, ...]

    def keys(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Two keys: by canonical paths, and by bound file identities (device, inode)."""
        by_path = (self.uid, self.run_as, tuple((path, args) for path, _d, _i, args in self.stages))
        # A stage with no bound identity (a file operation) keeps its path here too.
        by_file = (self.uid, self.run_as, tuple(((d, i) if d >= 0 else p, a) for p, d, i, a in self.stages))
        return by_path, by_file

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "run_as": self.run_as,
            "stages": [{"path": p, "dev": d, "ino": i, "args": list(a)} for p, d, i, a in self.stages],
        }

    @classmethod
    def from_dict(cls, untrusted: Any) -> Meaning | None:
        """A journaled meaning read back, or None if it is not one (a damaged or foreign record)."""
        if not isinstance(untrusted, Mapping):
            return None
        uid, run_as, stages = _int(untrusted.get("uid")), _int(untrusted.get("run_as")), untrusted.get("stages")
        if uid is None or run_as is None or not isinstance(stages, list) or not stages:
            return None
        out: list[Stage] = []
        for stage in stages:
            if not isinstance(stage, Mapping):
                return None
            path, dev, ino, args = stage.get("path"), _int(stage.get("dev")), _int(stage.get("ino")), stage.get("args")
            if not isinstance(path, str) or dev is None or ino is None or not isinstance(args, list):
                return None
            if not all(isinstance(a, str) for a in args):
                return None
            out.append((path, dev, ino, tuple(args)))
        return cls(uid, run_as, tuple(out))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def of_command(
    uid: int, run_as: int, stages: Sequence[Sequence[str]], resolved: Sequence[str | None], binaries: Any
) -> Meaning:
    """A command's meaning: each stage's canonical binary (``resolved``, the policy's resolution), the
    identity bound to the ticket (``bound["binaries"]``, when there is one) and its arguments."""
    bound = binaries if isinstance(binaries, list) and len(binaries) == len(stages) else [{}] * len(stages)
    paths = [*resolved, *[None] * len(stages)][: len(stages)]
    out: list[Stage] = []
    for argv, path, identity in zip(stages, paths, bound, strict=True):
        ident = identity if isinstance(identity, Mapping) else {}
        dev, ino = _int(ident.get("dev")), _int(ident.get("ino"))
        if dev is None or ino is None:
            dev = ino = -1
        out.append((path or str(argv[0]), dev, ino, tuple(argv[1:])))
    return Meaning(uid, run_as, tuple(out))


def of_file(uid: int, run_as: int, tool: str, canonical: str | None, path: str) -> Meaning:
    """A file operation's meaning: the tool on the canonical path."""
    return Meaning(uid, run_as, ((f"file:{tool}", -1, -1, (canonical or path,)),))


class DenialMemory:
    """Every denial a person made in the last ``keep`` seconds, by meaning; unknown until loaded."""

    def __init__(self) -> None:
        self.known = False  # False until the journal's denials are read (restore): then everything is covered
        self._seen: dict[tuple[Any, ...], float] = {}

    def add(self, meaning: Meaning, when: float) -> None:
        for key in meaning.keys():
            self._seen[key] = max(when, self._seen.get(key, when))

    def covers(self, meaning: Meaning, now: float, keep: float) -> bool:
        """Whether a person denied this meaning within ``keep`` seconds (always, while not known)."""
        if not self.known:
            return True
        cutoff = now - keep
        return any(self._seen.get(key, cutoff - 1) >= cutoff for key in meaning.keys())

    def forget_before(self, cutoff: float) -> None:
        """Drop what was denied before ``cutoff`` (older than the memory keeps)."""
        for key in [k for k, when in self._seen.items() if when < cutoff]:
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)
