"""The fleet console's view (issue 49): what each host says is pending, grouped by exact request.

The console keeps no state a host does not have: a `HostView` is the last
answer of one host (its ``pending`` list and the statements it published
for them, its running jobs, its hold), replaced whole at each refresh, so
two consoles built from the same hosts show the same thing.  `rows` groups
every host's pending requests by `groups.request_key` of the statement (a
group never mixes requests that differ in a bound byte) and says how many
hosts and which.  `panel` is one host's line of the page: pending, running
jobs, hold, the relay's last post and its lag, the collector's verdict on
its chain, last contact.  `Filters` narrow both, server-side: a host group
(``web.fleet_groups``), an agent, a rule.

Pure: no I/O.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airlock.common import groups
from airlock.common.codec import parse_iso

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
    running: tuple[Mapping[str, Any], ...] = ()  # its runner's jobs (`airlock running --json`)
    status: Mapping[str, Any] = field(default_factory=dict)  # its `airlock status --json` (the hold)


@dataclass(frozen=True, slots=True)
class RelayMark:
    """A host's newest signed fleet relay post: its journal seq, the event's time, when it came."""

    seq: int | None
    event_time: float | None
    received: float


@dataclass(frozen=True, slots=True)
class Filters:
    """The page's filters, from its query: a host group's hosts (None: every host), an agent, a rule."""

    hosts: frozenset[str] | None = None
    group: str = ""
    agent: str = ""
    rule: str = ""

    @classmethod
    def of(cls, query: Mapping[str, str], host_groups: Mapping[str, Sequence[str]]) -> Filters:
        """`ValueError` for a group the configuration does not name (never "no filter": that would show more)."""
        group, agent, rule = (str(query.get(k) or "").strip() for k in ("group", "agent", "rule"))
        if group and group not in host_groups:
            raise ValueError(f"no host group {group!r} (web.fleet_groups)")
        hosts = frozenset(host_groups[group]) if group else None
        return cls(hosts, group, agent[:256], rule[:256])

    def host(self, name: str) -> bool:
        return self.hosts is None or name in self.hosts

    def request(self, entry: Mapping[str, Any] | None) -> bool:
        """A pending request (as ``airlock pending --json`` lists it) the agent and rule filters keep."""
        if not self.agent and not self.rule:
            return True
        if entry is None:
            return False
        found = entry.get("peer")
        peer: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        agents = {str(peer.get("user") or ""), str(peer.get("uid"))}
        return (not self.agent or self.agent in agents) and (not self.rule or self.rule == entry.get("rule"))

    def job(self, job: Mapping[str, Any]) -> bool:
        """A running job the agent filter keeps (by the agent's name as its host says it, or uid; the rule
        filter is for pending requests: a job is shown whatever its rule)."""
        return not self.agent or self.agent in (str(job.get("agent") or ""), str(job.get("agent_uid")))

    def query(self) -> dict[str, str]:
        return {k: v for k, v in (("group", self.group), ("agent", self.agent), ("rule", self.rule)) if v}


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


def rows(views: Iterable[HostView], filters: Filters | None = None) -> list[Row]:
    """Every host's pending requests (those ``filters`` keep), grouped by exact request; the soonest to expire first."""
    by_key: dict[str, list[Member]] = {}
    for view in views:
        if filters is not None and not filters.host(view.host):
            continue
        entries = {str(p.get("request_id")): p for p in view.pending} if filters is not None else {}
        for request_id, statement in view.statements.items():
            if filters is not None and not filters.request(entries.get(request_id)):
                continue
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


def panel(
    view: HostView,
    relay: RelayMark | None = None,
    collected: Mapping[str, Any] | None = None,
    filters: Filters | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """One host's line of the page (every value as the host or the collector said it: the page escapes)."""
    now = time.time() if now is None else now
    keep = filters or Filters()
    status = view.status or {}
    jobs = [
        {
            "job": str(j.get("request_id") or j.get("operation_id") or ""),
            "request_id": j.get("request_id"),
            "operation_id": str(j.get("operation_id") or ""),
            "agent_uid": j.get("agent_uid"),
            "agent": str(j.get("agent") or j.get("agent_uid")),  # the host's name for the uid (`airlock running`)
            "as": str(j.get("user") or j.get("uid")),
            "since": str(j.get("started_at") or ""),
            "command": " | ".join(
                " ".join(map(str, stage)) for stage in j.get("stages") or [] if isinstance(stage, list)
            ),
        }
        for j in view.running
        if keep.job(j)
    ]
    return {
        "host": view.host,
        "state": "failing" if view.error else ("ok" if view.contact else "connecting"),
        "error": view.error,
        "contact": view.contact or None,
        "pending": sum(1 for p in view.pending if not p.get("attached_to") and keep.request(p)),
        "running": jobs,
        "hold": {
            "held": bool(status.get("hold")),
            "reason": status.get("hold_reason"),
            "by": status.get("hold_by"),
            "since": status.get("hold_since"),
        }
        if status
        else None,
        "relay": None
        if relay is None
        else {
            "seq": relay.seq,
            "time": relay.event_time,
            "received": relay.received,
            "lag": None if relay.event_time is None else round(max(0.0, now - relay.event_time), 1),
        },
        "collector": None if collected is None else dict(collected),
    }


event_time = parse_iso  # a relay post's ``time`` as Unix seconds (None when absent or unreadable)
