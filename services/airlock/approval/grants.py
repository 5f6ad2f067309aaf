"""Time-boxed grants (issue 18): an operator's approval that also lets the same work through for a while.

``airlock approve ID --grant 30m [--scope command|rule]`` approves the request
and, until the grant expires or is revoked, lets the **same requester** (uid,
and session if the request had one) run without asking:

- ``command`` (the default): the exact same spec (its digest: argv, privilege,
  environment, directory, input and limits);
- ``rule``: anything the rule that asked allows -- a request every stage of
  which the same named rule decided.

A grant only ever turns an ``ask`` into an ``allow``: a ``deny`` is decided
before grants are looked at, a quorum rule (``approvals`` of 2 or more) never
takes one, and while airlock is on hold no grant applies.  The store is
rebuilt at start from the journal's records (`restore`), like the hold.

Pure: no I/O; the caller passes the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

SCOPES: Final = ("command", "rule")
GRANT_ACTIONS: Final = ("grant", "grant.revoke", "grant.expired")


@dataclass(frozen=True, slots=True)
class Grant:
    grant_id: str
    uid: int
    session: str | None
    scope: str  # command or rule
    digest: str  # the spec's digest (scope command)
    rule: str  # the rule that asked (scope rule)
    expires: float  # Unix seconds
    made_by: str
    request_id: str
    command: str  # for people: what was approved

    def covers(self, uid: int, session: str | None, digest: str, rule: str, stage_rules: Iterable[str]) -> bool:
        if uid != self.uid or (self.session is not None and session != self.session):
            return False
        if self.scope == "command":
            return digest == self.digest
        return rule == self.rule and all(r == self.rule for r in stage_rules)

    def to_dict(self) -> dict[str, Any]:
        return {
            "grant_id": self.grant_id,
            "uid": self.uid,
            "session": self.session,
            "scope": self.scope,
            "digest": self.digest,
            "rule": self.rule,
            "expires": self.expires,
            "made_by": self.made_by,
            "request_id": self.request_id,
            "command": self.command,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Grant:
        session = d.get("session")
        return cls(
            grant_id=str(d["grant_id"]),
            uid=int(d["uid"]),
            session=str(session) if session is not None else None,
            scope=str(d["scope"]),
            digest=str(d.get("digest") or ""),
            rule=str(d.get("rule") or ""),
            expires=float(d["expires"]),
            made_by=str(d.get("made_by") or ""),
            request_id=str(d.get("request_id") or ""),
            command=str(d.get("command") or ""),
        )


class Grants:
    def __init__(self) -> None:
        self._live: dict[str, Grant] = {}

    def add(self, grant: Grant) -> None:
        self._live[grant.grant_id] = grant

    def remove(self, grant_id: str) -> Grant | None:
        return self._live.pop(grant_id, None)

    def get(self, grant_id: str) -> Grant | None:
        return self._live.get(grant_id)

    def expired(self, now: float) -> list[Grant]:
        """Grants whose time is up (still in the store: the caller journals their end, then removes them)."""
        return [g for g in self._live.values() if g.expires <= now]

    def find(
        self, now: float, uid: int, session: str | None, digest: str, rule: str, stage_rules: Iterable[str]
    ) -> Grant | None:
        rules = tuple(stage_rules)
        for grant in sorted(self._live.values(), key=lambda g: g.grant_id):
            if grant.expires > now and grant.covers(uid, session, digest, rule, rules):
                return grant
        return None

    def live(self, now: float) -> list[Grant]:
        return sorted((g for g in self._live.values() if g.expires > now), key=lambda g: g.expires)


def restore(records: Iterable[Mapping[str, Any]]) -> tuple[list[Grant], set[str]]:
    """From the journal's grant records (oldest first): the grants made, and the IDs that ended."""
    made: dict[str, Grant] = {}
    ended: set[str] = set()
    for record in records:
        action = record.get("action")
        if action == "grant" and isinstance(record.get("grant"), Mapping):
            try:
                grant = Grant.from_dict(record["grant"])
            except (KeyError, TypeError, ValueError):
                continue
            made[grant.grant_id] = grant
        elif action in ("grant.revoke", "grant.expired") and isinstance(record.get("grant_id"), str):
            ended.add(record["grant_id"])
    return [g for g in made.values() if g.grant_id not in ended], ended
