"""Which policy is in force, and why: the files on disk, the last accepted copy, or none (issue 44).

Pure: no I/O.  Approval builds a `Standing` when it loads or reloads the policy, and every surface an
operator or agent reads (`status`, `pending`'s header, `can`, the relay, journald) says the
same `sentence()`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Any


class PolicyMode(StrEnum):
    CURRENT = "current"  # the files on disk, accepted
    LAST_GOOD = "last-good"  # the files on disk were refused: the last accepted policy decides
    CLOSED = "closed"  # refused, and no accepted policy kept: every request asks a person


@dataclasses.dataclass(frozen=True, slots=True)
class Standing:
    mode: PolicyMode = PolicyMode.CURRENT
    refused: tuple[str, ...] = ()  # every error of the refused files, path:line:col first
    refused_at: float | None = None
    accepted_at: float | None = None  # when the policy in force was accepted

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": str(self.mode),
            "refused": list(self.refused),
            "refused_at": self.refused_at,
            "accepted_at": self.accepted_at,
            "sentence": self.sentence(),
        }

    def sentence(self) -> str | None:
        """One line for a person; None while the files on disk are in force."""
        if not self.refused:
            return None
        count = len(self.refused)
        first = self.refused[0]
        why = f"the policy files on disk were refused ({count} error{'s' if count != 1 else ''}; first: {first})"
        if self.mode is PolicyMode.CLOSED:
            return f"{why}; no accepted policy is kept, so every request asks a person. Fix the files, then reload."
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.accepted_at)) if self.accepted_at else "?"
        return f"{why}; the policy accepted at {when} decides. Fix the files, then reload."


def refused(errors: Sequence[str], *, kept_at: float | None, now: float) -> Standing:
    """The standing after a refusal: the kept policy's (accepted at ``kept_at``), or closed without one."""
    mode = PolicyMode.LAST_GOOD if kept_at is not None else PolicyMode.CLOSED
    return Standing(mode, tuple(errors) or ("(no message)",), now, kept_at)
