"""approval/promote.py: a promoted request is journaled and announced, unless it was decided first."""

from __future__ import annotations

import asyncio
from typing import Any

from airlock.approval import fileop_review, promote
from airlock.approval.transitions import State


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, Any]] = []

    async def record(self, kind: str, ids: Any, *, payload: dict[str, Any]) -> None:
        self.records.append((kind, payload))


class Hook:
    def __init__(self) -> None:
        self.called: list[dict[str, Any]] = []

    def pending(self, request: dict[str, Any]) -> None:
        self.called.append(request)


class Log:
    def info(self, *args: Any, **kwargs: Any) -> None:
        pass

    def warning(self, *args: Any, **kwargs: Any) -> None:
        pass


class Entry:
    """The parts of a `Pending` that announce reads."""

    def __init__(self, decided: bool) -> None:
        self.state = State.ALLOWED if decided else State.PENDING
        self.request_id, self.operation_id, self.expires = "second", "op-2", 10**10
        self.peer = type("P", (), {"uid": 1000})()


def test_a_request_decided_before_its_announcement_is_not_announced(monkeypatch: Any) -> None:
    monkeypatch.setattr(promote, "pending_payload", lambda entry, timeout, votes: {"timeout_seconds": timeout})
    monkeypatch.setattr(fileop_review, "for_observer", lambda view: view)

    async def body(decided: bool) -> tuple[Recorder, Hook]:
        audit, hook = Recorder(), Hook()
        entry = Entry(decided)
        entry.to_dict = lambda now: {"request_id": "second"}  # type: ignore[attr-defined]
        leader = type("L", (), {"request_id": "first"})()
        await promote.announce(audit, hook, None, Log(), entry, leader, None)  # type: ignore[arg-type]
        return audit, hook

    audit, hook = asyncio.run(body(decided=False))  # control: a waiting one is journaled and announced
    assert [kind for kind, _ in audit.records] == ["approval.promoted"] and len(hook.called) == 1
    assert audit.records[0][1]["was_attached_to"] == "first"
    audit, hook = asyncio.run(body(decided=True))
    assert audit.records == [] and hook.called == []
