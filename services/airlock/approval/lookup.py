"""Reading a request's trail back from the journal, for `show` and `airlock wait`.

The journal's feed matches scopes exactly, and so do these reads: a prefix is
never looked up in the journal (issue 27: a prefix names only a request
pending now, approval/refs.py).  Every read is one bounded page (reference/004
paging).
"""

from __future__ import annotations

from typing import Any

from airlock.common.wire.journal import EVENTS, Events
from airlock.common.wire.verb import Stub

PAGE = 256


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
