"""A person's action on a host, carried by the fleet console (issue 49): the statement and its challenge.

Kill, hold and release from a fleet console are not the console's to do: its
SSH login on each host is an observer.  The host makes an *action statement*
(approval/hostactions.py: the action, this host's name, the job or the hold,
a fresh nonce and an expiry), the person's passkey signs `challenge` over the
sorted digests of one or more hosts' statements (one touch holds every host),
and each host checks, before it acts, that its own statement's digest is in
the signed list and that the assertion verifies over the challenge it
recomputed.  A statement names one host, one job and one nonce the host keeps
once, so an assertion is good for that action on that host, once.

Its own context: never a decision's, a group's or a sign-in's challenge.
Here (not in approval) because both sides use it.  Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Final

CONTEXT: Final = b"airlock passkey action v1\n"
HEADER: Final = "airlock action v1"
ACTIONS: Final = ("kill", "hold", "release")
MAX_MEMBERS: Final = 10_000  # hosts in one touch (hold every host)
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def render(fields: Mapping[str, str]) -> str:
    """The statement: a header, then one ``name: "JSON string"`` line per field, in the given order."""
    lines = [HEADER, *(f"{name}: {json.dumps(value, ensure_ascii=True)}" for name, value in fields.items())]
    return "\n".join(lines) + "\n"


def parse(statement: str) -> dict[str, str]:
    """A statement's fields (for a page); unreadable lines skipped."""
    out: dict[str, str] = {}
    for line in statement.split("\n")[1:]:
        name, sep, raw = line.partition(": ")
        if sep:
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if isinstance(value, str):
                out[name] = value
    return out


def digest(statement: str) -> str:
    return hashlib.sha256(statement.encode("ascii")).hexdigest()


def members(digests: Iterable[object]) -> tuple[str, ...]:
    """The signed list as each host checks it: 1 to `MAX_MEMBERS` sha256 hex digests, sorted, each once."""
    found = list(digests)
    if not 1 <= len(found) <= MAX_MEMBERS:
        raise ValueError(f"members: 1 to {MAX_MEMBERS} statement digests")
    if any(not isinstance(d, str) or not _HEX64.fullmatch(d) for d in found):
        raise ValueError("members: each must be 64 lowercase hex digits")
    if found != sorted(set(found)):  # type: ignore[type-var]
        raise ValueError("members: must be sorted, each once")
    return tuple(str(d) for d in found)


def challenge(digests: Iterable[str]) -> bytes:
    """sha256(b"airlock passkey action v1\\n" + "members: N\\n" + one digest a line): one touch, N hosts' actions."""
    listed = members(digests)
    text = f"members: {len(listed)}\n" + "".join(f"{d}\n" for d in listed)
    return hashlib.sha256(CONTEXT + text.encode("ascii")).digest()
