"""The fleet console's view (issue 49): what each host says is pending, grouped by exact request.

The console keeps no state a host does not have: a `HostView` is the last
answer of one host (its ``pending`` list and the statements it published
for them), replaced whole at each refresh, so two consoles built from the
same hosts show the same thing.  `rows` groups every host's pending
requests by `groups.request_key` of the statement (a group never mixes
requests that differ in a bound byte) and says how many hosts and which.

Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airlock.common import groups

# A statement's fields a page shows (all but the per-host ones and the binding's hash).
SHOWN = ("decision", "requester", "run_as", "command", "cwd", "stdin", "reason", "arguments", "credentials")


@dataclass(frozen=True, slots=True)
class HostView:
    """One host's last answer: its pending requests and their allow statements' text (by request ID)."""

    host: str
    pending: tuple[Mapping[str, Any], ...] = ()
    statements: Mapping[str, str] = field(default_factory=dict)
    error: str = ""  # why the last refresh failed ("" when it answered)
    contact: float = 0.0  # when it last answered (Unix seconds; 0: never)


@dataclass(frozen=True, slots=True)
class Member:
    host: str
    request_id: str
    statement: str  # the exact text the host published

    @property
    def expires(self) -> int:
        return expires_of(self.statement)


@dataclass(frozen=True, slots=True)
class Row:
    """The same request pending on one or more hosts: one touch decides it on all of them."""

    key: str
    members: tuple[Member, ...]  # sorted by host, then request ID

    @property
    def hosts(self) -> list[str]:
        return sorted({m.host for m in self.members})

    def to_dict(self) -> dict[str, Any]:
        """What a page shows: the request's fields (every member has the same ones), the hosts, the members."""
        shown = groups.fields(self.members[0].statement)
        return {name: shown.get(name, "") for name in SHOWN} | {
            "key": self.key,
            "hosts": self.hosts,
            "members": [{"host": m.host, "id": m.request_id} for m in self.members],
            "expires": min(m.expires for m in self.members),
        }


def rows(views: Iterable[HostView]) -> list[Row]:
    """Every host's pending requests, grouped by exact request; the soonest to expire first."""
    by_key: dict[str, list[Member]] = {}
    for view in views:
        for request_id, statement in view.statements.items():
            key = _key(statement)
            by_key.setdefault(key, []).append(Member(view.host, request_id, statement))
    out = [Row(key, tuple(sorted(members, key=lambda m: (m.host, m.request_id)))) for key, members in by_key.items()]
    return sorted(out, key=lambda r: (min(m.expires for m in r.members), r.key))


# A statement is fixed while its request is pending: its key and expiry are worked out once, not per page.
@functools.lru_cache(maxsize=1 << 16)
def _key(statement: str) -> str:
    return groups.request_key(statement.encode("ascii", "replace"))


@functools.lru_cache(maxsize=1 << 16)
def expires_of(statement: str) -> int:
    """A statement's expiry (Unix seconds; 0 if it has none)."""
    value = groups.fields(statement).get("expires", "0")
    return int(value) if value.isdigit() else 0


def warm(statements: Iterable[str]) -> None:
    """Work out each new statement's key and expiry when it arrives (a refresh), so no page pays for it."""
    for statement in statements:
        _key(statement)
        expires_of(statement)


def pick(found: Iterable[Row], key: str, hosts: Iterable[str] | None = None) -> Row | None:
    """The row of ``key``, narrowed to ``hosts`` when given (deny one host's request alone)."""
    wanted = None if hosts is None else set(hosts)
    for row in found:
        if row.key == key:
            members = tuple(m for m in row.members if wanted is None or m.host in wanted)
            return Row(key, members) if members else None
    return None
