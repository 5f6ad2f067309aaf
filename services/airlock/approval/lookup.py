"""Reading a request's trail back from the journal, for `show`, `show --output` and `airlock wait`.

A reference names one request exactly: its ID (``AGENT/ID`` when several
agents used it), its operation ID, or a prefix of an ID that starts exactly
one request the journal holds (`prefixed`, issue 44: what `show` and
`show --output` read; the docs' own example is a prefix).  A prefix that
starts several is refused with them listed.  Deciding never takes a prefix
from here: approve and deny name a request pending now exactly
(approval/refs.py, issue 27).  Every read is bounded pages (reference/004
paging).
"""

from __future__ import annotations

from typing import Any

from airlock.approval import refs
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import user_name
from airlock.common.wire.journal import EVENTS, Events
from airlock.common.wire.verb import Stub

PAGE = 256
CANDIDATES = 16  # the most IDs an ambiguous prefix's refusal lists


class JournalLookup:
    def __init__(self, journal: Stub) -> None:
        self.journal = journal

    async def scoped(self, scope: dict[str, Any], pages: int = 8) -> list[dict[str, Any]]:
        """Events matching ``scope``, oldest first (at most ``pages`` pages)."""
        events: list[dict[str, Any]] = []
        after = 0
        for _ in range(pages):
            page = await self.journal.call(EVENTS, Events(after=after, limit=PAGE, scope=scope))
            events.extend(page.events)
            if len(page.events) < PAGE:
                break
            after = page.next_cursor
        return events

    async def request_events(self, request_id: str) -> list[dict[str, Any]]:
        return await self.scoped({"request_id": request_id})

    async def operation_events(self, operation_id: str) -> list[dict[str, Any]]:
        """The events of the operation's newest request that did more than replay an outcome."""
        by_request: dict[str, list[dict[str, Any]]] = {}
        for event in await self.scoped({"operation_id": operation_id}):
            by_request.setdefault(event.get("request_id") or "", []).append(event)
        groups: list[list[dict[str, Any]]] = list(by_request.values())
        ran = [g for g in groups if not any(e.get("kind") == "operation.replayed" for e in g)]
        chosen: list[dict[str, Any]] = (ran or groups or [[]])[-1]
        return chosen

    async def one_agents(self, ref: str) -> list[dict[str, Any]]:
        """The journal events of the request ``ref`` names: an ID one agent used, or ``AGENT/ID``.

        Request IDs are each agent's own (issue 27): an ID several agents used
        names several stories, and is refused with their owners.
        """
        events = await self.request_events(ref)
        if not events and "/" in ref:
            owner, _, bare = ref.partition("/")
            uid = refs.agent_uid(owner)
            return [e for e in await self.request_events(bare) if refs.belongs_to(e, uid)] if uid is not None else []
        owners: list[int] = sorted(
            {
                e["peer_uid"]
                for e in events
                if e.get("kind") == "request.received" and isinstance(e.get("peer_uid"), int)
            }
        )
        if len(owners) > 1:
            names = [user_name(uid) for uid in owners]
            raise AirlockError(
                ErrorCode.CONFLICT,
                f"request ID {ref!r} was used by {len(owners)} agents ("
                + ", ".join(f"{n} uid {u}" for n, u in zip(names, owners, strict=True))
                + "); name one as AGENT/ID: "
                + ", ".join(f"{n}/{ref}" for n in names),
                {
                    "owners": [{"user": n, "uid": u} for n, u in zip(names, owners, strict=True)],
                    "references": [f"{n}/{ref}" for n in names],
                },
            )
        return events

    async def prefixed(self, prefix: str) -> list[dict[str, Any]]:
        """The events of the one request whose ID starts with ``prefix`` (none: ``[]``).

        One ``request.received`` per request is read (the journal's index
        range, `journal/reads.py`); several IDs: ``conflict`` listing them.
        """
        scope = {"request_prefix": prefix, "kind": "request.received"}
        ids = sorted({str(e["request_id"]) for e in await self.scoped(scope, pages=2) if e.get("request_id")})
        if len(ids) > 1:
            shown = ", ".join(ids[:CANDIDATES]) + (", …" if len(ids) > CANDIDATES else "")
            raise AirlockError(
                ErrorCode.CONFLICT,
                f"{prefix!r} starts {len(ids)} requests: {shown}; give more of the ID",
                {"matches": ids[:CANDIDATES]},
            )
        return await self.one_agents(ids[0]) if ids else []
