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

``--uses N`` (issue 34) also bounds how often: the grant is used up after N
requests.  A use is taken in memory at the moment the grant is found
(`Grants.take`, no await between finding and taking, so requests racing on
one event loop cannot both take the last use), journaled as the request's
``approval.decided`` (``by: grant``, ``grant_use``), and counted again from
those records at start, so a restart gives no uses back.

Pure: no I/O; the caller passes the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from airlock.common.wire.picking import GRANT_MAX_USES, GRANT_SCOPES

SCOPES: Final = GRANT_SCOPES
GRANT_ACTIONS: Final = ("grant", "grant.revoke", "grant.expired", "grant.exhausted")
# The records that end a grant (revoked, time up, uses used up).
ENDING: Final = frozenset({"grant.revoke", "grant.expired", "grant.exhausted"})
MAX_USES: Final = GRANT_MAX_USES


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
    uses: int | None = None  # issue 34: used up after this many requests; None: until it expires

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
            "uses": self.uses,
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
            uses=_uses(d.get("uses")),
        )


def _uses(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_USES:
        raise ValueError("uses must be a whole number from 1")
    return value


class Grants:
    def __init__(self) -> None:
        self._live: dict[str, Grant] = {}
        self._used: dict[str, int] = {}  # uses taken so far (journaled or being journaled)

    def add(self, grant: Grant, used: int = 0) -> None:
        self._live[grant.grant_id] = grant
        self._used[grant.grant_id] = used

    def remove(self, grant_id: str) -> Grant | None:
        self._used.pop(grant_id, None)
        return self._live.pop(grant_id, None)

    def used(self, grant_id: str) -> int:
        return self._used.get(grant_id, 0)

    def uses_left(self, grant: Grant) -> int | None:
        return None if grant.uses is None else max(0, grant.uses - self.used(grant.grant_id))

    def take(self, grant: Grant) -> tuple[int, bool]:
        """Take one use of a live grant: (this use's number, 1-based; whether it was the last).

        A grant with its last use taken leaves the live set at once (before any
        await), so a request racing this one finds nothing and asks a person.
        """
        number = self._used.get(grant.grant_id, 0) + 1
        self._used[grant.grant_id] = number
        last = grant.uses is not None and number >= grant.uses
        if last:
            self._live.pop(grant.grant_id, None)
        return number, last

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


def restore(records: Iterable[Mapping[str, Any]]) -> tuple[list[tuple[Grant, int]], set[str]]:
    """From the journal's grant records (oldest first): the grants made with the uses each has had
    (``grant.used``), and the IDs that ended.  A grant whose uses are all used is ended too (approval
    stopped between its last use and the ``grant.exhausted`` record)."""
    made: dict[str, Grant] = {}
    used: dict[str, int] = {}
    ended: set[str] = set()
    for record in records:
        action = record.get("action")
        grant_id = record.get("grant_id")
        if action == "grant" and isinstance(record.get("grant"), Mapping):
            try:
                grant = Grant.from_dict(record["grant"])
            except (KeyError, TypeError, ValueError):
                continue
            made[grant.grant_id] = grant
        elif action in ENDING and isinstance(grant_id, str):
            ended.add(grant_id)
        elif action == "grant.used" and isinstance(grant_id, str):
            used[grant_id] = used.get(grant_id, 0) + 1
    live = []
    for grant in made.values():
        count = used.get(grant.grant_id, 0)
        if grant.uses is not None and count >= grant.uses:
            ended.add(grant.grant_id)
        if grant.grant_id not in ended:
            live.append((grant, count))
    return live, ended
