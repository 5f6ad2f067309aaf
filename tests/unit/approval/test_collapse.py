"""Identical pending requests decided together (issue 34), in approval itself, with the journal's writes gated.

The race a live stack cannot reliably show: the first request is withdrawn
(its agent left) while the second's ``approval.pending`` record is being
written.  The second must not stay attached to a request that is gone (it
would be hidden from operators until it timed out): it becomes a question
of its own.  And one decision of the first decides an attached second.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from airlock.approval.rules import Decision, Policy
from airlock.approval.service import Approval
from airlock.approval.transitions import Outcome
from airlock.approval.verdict import Decided
from airlock.common.audit import Ids
from airlock.common.config import load
from airlock.common.peer import Peer
from airlock.common.spec import ExecSpec


class Gated:
    """An audit whose writes for the named requests wait until released."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.records: list[tuple[str, str | None, dict[str, Any]]] = []

    async def record(self, kind: str, ids: Ids, *, payload: dict[str, Any], **_: Any) -> None:
        gate = self.gates.get(str(ids.request_id))
        if gate is not None and kind == "approval.pending":
            await gate.wait()
        self.records.append((kind, ids.request_id, payload))


class Connection:
    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def wait_gone(self) -> None:
        await self.gone.wait()


class FakeCall:
    def __init__(self) -> None:
        self.connection = Connection()
        self.peer = Peer(uid=0, gid=0, pid=1, user="root", groups=frozenset({"root"}), group_ids=(0,))

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        return None


def approval(tmp_path: Path) -> tuple[Approval, Gated]:
    empty = tmp_path / "airlock.yaml"
    empty.write_text("")
    config = load(empty)
    audit = Gated()
    a = Approval(config, Policy(default="ask", rules=(), sources=()), None, audit)  # type: ignore[arg-type]
    a.book.hold_reason = None
    a.book._hold_known.set()  # as after the start's restore (every hold read waits for it)
    a.reviewing.memory.known = True  # as restored at start: no denials
    return a, audit


def ask(a: Approval, call: FakeCall, request_id: str, peer: Peer) -> asyncio.Task[dict[str, Any]]:
    spec = ExecSpec(mode="exec", stages=(("touch", "/tmp/x"),), privileged=False, uid=peer.uid)
    request = {"request_id": request_id, "spec": spec.to_dict()}
    decision = Decision(decision="ask", rule="default", stages=())
    ids = Ids(request_id, f"op-{request_id}", peer.uid, None)
    return asyncio.ensure_future(
        a.deciding._wait_for_operator(call, request, peer, decision, spec.digest(), {}, ids, spec)  # type: ignore[arg-type]
    )


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


PEER = Peer(uid=4242, gid=4242, pid=1, user="agent", groups=frozenset({"agent"}), group_ids=(4242,))


def test_a_second_request_whose_first_left_meanwhile_is_a_question_of_its_own(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, audit = approval(tmp_path)
        first_call, second_call = FakeCall(), FakeCall()
        first = ask(a, first_call, "r-1", PEER)
        await settle()
        audit.gates["r-2"] = asyncio.Event()
        second = ask(a, second_call, "r-2", PEER)
        await settle()  # r-2 chose r-1 as its first, and waits for its record
        first_call.connection.gone.set()  # r-1's agent leaves: withdrawn
        await settle()
        assert first.done() and first.exception() is not None  # withdrawn
        audit.gates["r-2"].set()
        await settle()
        entry = a.pending[(PEER.uid, "r-2")]
        assert entry.attached_to is None  # a question of its own, not hidden behind r-1
        listed = (await a.operating.list_pending(second_call))["pending"]  # type: ignore[arg-type]
        assert [p["request_id"] for p in listed] == ["r-2"] and "attached_to" not in listed[0]
        a.pending.settle(entry, Outcome(Decided.DENY, "root", 0, ""))
        await settle()
        assert second.done() and second.exception() is not None  # denied

    asyncio.run(scenario())


def test_one_decision_of_the_first_decides_an_attached_second(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, audit = approval(tmp_path)
        first = ask(a, FakeCall(), "r-1", PEER)
        await settle()
        second = ask(a, FakeCall(), "r-2", PEER)
        other = ask(
            a,
            FakeCall(),
            "r-3",
            Peer(uid=4343, gid=4343, pid=2, user="other", groups=frozenset({"other"}), group_ids=(4343,)),
        )
        await settle()
        assert a.pending[(PEER.uid, "r-2")].attached_to == (PEER.uid, "r-1")
        assert a.pending[(4343, "r-3")].attached_to is None  # another agent's: never attached
        a.pending.settle(a.pending[(PEER.uid, "r-1")], Outcome(Decided.DENY, "root", 0, "no"))
        await settle()
        assert first.done() and second.done() and not other.done()
        assert first.exception() is not None and second.exception() is not None  # both denied
        decided = {rid: p for kind, rid, p in audit.records if kind == "approval.decided"}
        assert decided["r-2"]["decision"] == "deny" and decided["r-2"]["decided_with"] == "r-1"
        a.pending.settle(a.pending[(4343, "r-3")], Outcome(Decided.DENY, "root", 0, ""))
        await settle()
        assert other.exception() is not None

    asyncio.run(scenario())
