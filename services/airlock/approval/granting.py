"""The live grants as an object that owns them: the store, each grant's timer, its journaled start and end.

`GrantBook` is approval's one place for time-boxed grants (issue 18, uses
issue 34): ``decide`` finds one that covers a request and takes a use
(`find`, `take`, `after_use`); an operator's approve makes one (`asked_for`
checks what was asked, `make` journals it and starts it); it ends when it
expires, is used up or is revoked (`end`, journaled after it is out of the
live set).  The grants themselves and their matching are `grants` (pure).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterable
from typing import Any

from airlock.approval.grants import Grant, Grants
from airlock.approval.pending import Pending
from airlock.common import validate
from airlock.common.audit import Audit, Ids
from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer


class GrantBook:
    """The live grants, their timers and their records."""

    def __init__(self, audit: Audit, log: Any) -> None:
        self.audit = audit
        self.log = log
        self.store = Grants()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def find(
        self, now: float, uid: int, session: str | None, digest: str, rule: str, stage_rules: Iterable[str]
    ) -> Grant | None:
        """A live grant that covers this request (`Grant.covers`), if any."""
        return self.store.find(now, uid, session, digest, rule, stage_rules)

    def take(self, grant: Grant) -> tuple[int, bool]:
        """One use of ``grant`` (synchronous: see `grants.Grants.take`)."""
        return self.store.take(grant)

    def live(self, now: float) -> list[Grant]:
        return self.store.live(now)

    async def after_use(self, grant: Grant, number: int) -> None:
        """A grant's use is journaled: end the grant if that was its last (``grant.exhausted``)."""
        if grant.uses is not None and number >= grant.uses:
            await self.end(grant.grant_id, "grant.exhausted", None, f"used {number} of {grant.uses} times", grant)

    @staticmethod
    def asked_for(
        entry: Pending, operator: Peer, seconds: float | None, scope: str | None, uses: int | None, limit: float
    ) -> Grant | None:
        """The grant an approve asks for (``grant_seconds``, ``scope``, ``uses``), checked; None without one.

        Their shapes are the declaration's (`wire.operator.Decision`, ``DecideBegin``); here what
        depends on the request and the settings: ``limit`` is ``approval.max_grant_seconds`` now
        (a reload may change it)."""
        if seconds is None:
            return None
        if not 1 <= seconds <= limit:
            raise validate.bad(
                "grant_seconds", f"must be a number of seconds from 1 to {limit:g} (approval.max_grant_seconds)"
            )
        scope = scope or "command"
        if "spec" not in entry.request:
            raise AirlockError(ErrorCode.CONFLICT, "grants cover commands only, not file operations")
        if entry.tally is not None and entry.tally.requirement.approvals > 1:
            raise AirlockError(ErrorCode.CONFLICT, "a rule that needs several approvers takes no grant")
        if entry.bound.get("arguments"):
            raise AirlockError(
                ErrorCode.CONFLICT,
                "no grant for a request whose path arguments someone other than root can change "
                "(approve it without --grant: each run is then decided again)",
                {"arguments": [a.get("path") for a in entry.bound["arguments"]]},
            )
        if entry.decision.decision != "ask" or entry.rule == "hold":
            raise AirlockError(
                ErrorCode.CONFLICT, "only a request a rule sent to an operator takes a grant (not one held)"
            )
        if scope == "rule" and entry.decision.rule in ("default", "unresolved"):
            raise AirlockError(
                ErrorCode.CONFLICT, "scope rule needs a named rule; this request was decided by the default"
            )
        assert entry.published is not None
        return Grant(
            grant_id="g-" + secrets.token_hex(6),
            uid=entry.peer.uid,
            session=entry.request.get("session") or None,
            scope=scope,
            digest=entry.digest,
            rule=entry.decision.rule,
            expires=time.time() + float(seconds),
            made_by=operator.user,
            request_id=entry.request_id,
            command=entry.published.statements["allow"].command,
            uses=uses,
        )

    async def make(self, grant: Grant, ids: Ids, operator: str, reason: str) -> None:
        """A grant an operator made: journaled, then live until it expires, is used up or revoked."""
        # Journaled before it can be used: the next start rebuilds the grants from these records.
        await self.audit.record(
            "operator.action",
            ids,
            payload={
                "action": "grant",
                "operator": operator,
                "reason": reason,
                "grant_id": grant.grant_id,
                "grant": grant.to_dict(),
                "expires_at": iso_utc(grant.expires, timespec="seconds"),
            },
        )
        self.schedule(grant)

    def schedule(self, grant: Grant, used: int = 0) -> None:
        """Live (with ``used`` uses had), ending when it expires (an expired one ends at once)."""
        self.store.add(grant, used)
        delay = max(0.0, grant.expires - time.time())
        loop = asyncio.get_running_loop()
        self._timers[grant.grant_id] = loop.call_later(
            delay, lambda: asyncio.ensure_future(self.end(grant.grant_id, "grant.expired", None, ""))
        )

    async def end(
        self, grant_id: str, action: str, operator: Peer | None, reason: str, taken: Grant | None = None
    ) -> Grant | None:
        """The grant ends (expired, exhausted, revoked): out of the live set first, then journaled."""
        used = self.store.used(grant_id)
        # Out first: from now on it lets nothing through (``taken``: its last use already took it out).
        grant = self.store.remove(grant_id) or taken
        timer = self._timers.pop(grant_id, None)
        if timer is not None:
            timer.cancel()
        if grant is None:
            return None
        try:
            await self.audit.record(
                "operator.action",
                Ids(grant.request_id, None, operator.uid if operator else None, grant.session),
                # Who and what it covered, and how often it was used: the relay announces the end (issue 34).
                payload={
                    "action": action,
                    "grant_id": grant_id,
                    "operator": operator.user if operator else "airlock-approval",
                    "reason": reason,
                    "agent_uid": grant.uid,
                    "command": grant.command,
                    "scope": grant.scope,
                    "rule": grant.rule,
                    "granted_by": grant.made_by,
                    "used": used,
                    "uses": grant.uses,
                },
            )
        except AirlockError as exc:
            # The grant is gone from memory either way; the next start sees it expired or journals the revoke again.
            self.log.error("approval.grant.unrecorded", grant_id=grant_id, action=action, error=exc.message)
            if action == "grant.revoke":
                raise
        return grant

    def listing(self, now: float) -> list[dict[str, Any]]:
        """The live grants as ``airlock grants`` lists them: time and uses left."""
        return [
            g.to_dict()
            | {"seconds_left": round(g.expires - now, 1), "expires_at": iso_utc(g.expires, timespec="seconds")}
            | {"used": self.store.used(g.grant_id), "uses_left": self.store.uses_left(g)}
            for g in self.store.live(now)
        ]

    async def revoke(self, grant_id: str, operator: Peer, reason: str) -> str:
        """An operator revokes a live grant by its ID or a unique prefix of it; the ID revoked."""
        if self.store.get(grant_id) is None:
            # A person types it: a unique prefix of a live grant names it, as `airlock show` takes
            # a prefix of a pending request (issue 32).  Revoking only takes a permission away.
            found = [g.grant_id for g in self.store.live(time.time()) if g.grant_id.startswith(grant_id)]
            if len(found) > 1:
                raise AirlockError(
                    ErrorCode.CONFLICT, f"{grant_id!r} starts several live grants: {', '.join(found)}", {"ids": found}
                )
            if not found:
                raise AirlockError(ErrorCode.NOT_FOUND, f"no live grant {grant_id!r} (see `airlock grants`)")
            grant_id = found[0]
        await self.end(grant_id, "grant.revoke", operator, reason)
        return grant_id
