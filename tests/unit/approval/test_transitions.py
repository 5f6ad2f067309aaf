"""One owner for a pending request's decision (issue 47): the transition table, the table that settles,
and nobody else.  In the spirit of h11's test_state.py: every legal move, every illegal one named."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest

from airlock.approval import transitions
from airlock.approval.pending import Pending
from airlock.approval.rules import Decision
from airlock.approval.table import PendingTable
from airlock.approval.transitions import MOVES, IllegalMove, Outcome, State
from airlock.approval.verdict import Decided
from airlock.common.peer import Peer

REPO = Path(__file__).resolve().parents[3]
APPROVAL = REPO / "services" / "airlock" / "approval"
PEER = Peer(pid=1, uid=1000, gid=1000, user="agent", group_ids=(1000,), groups=frozenset({"agent"}))
ENDS = [d for d in Decided if d is not Decided.ASK]
KEY = (PEER.uid, "r-1")


def _entry(request_id: str, created: float = 0.0, attached_to: tuple[int, str] | None = None) -> Pending:
    entry = Pending(request_id, f"op-{request_id}", PEER, {}, Decision("ask", "default", ()), "d" * 64, {}, created, 60)
    entry.attached_to = attached_to
    return entry


def _table(*entries: Pending) -> PendingTable:
    table = PendingTable()
    for entry in entries:
        table[(entry.peer.uid, entry.request_id)] = entry
    return table


def test_every_end_is_one_move_out_of_pending_and_nothing_else_is() -> None:
    assert {event for (_state, event) in MOVES} == set(ENDS)
    assert {state for (state, _event) in MOVES} == {State.PENDING}
    for state in State:
        for event in ENDS:
            if state is State.PENDING:
                assert transitions.move(state, event) is not State.PENDING
                continue
            with pytest.raises(IllegalMove) as illegal:
                transitions.move(state, event)
            assert str(illegal.value) == f"cannot settle a request that is {state.value} with {event.value!r}"
    with pytest.raises(ValueError, match="ask is not an outcome"):
        Outcome(Decided.ASK, "x")


@pytest.mark.parametrize("event", ENDS)
def test_settling_a_settled_request_raises_and_changes_nothing(event: Decided) -> None:
    async def scenario() -> None:
        entry = _entry("r-1")
        table = _table(entry)
        assert table.is_open(entry)
        table.settle(entry, Outcome(Decided.DENY, "root", 0, "no"))
        with pytest.raises(IllegalMove, match="that is denied with"):
            table.settle(entry, Outcome(event, "someone else"))
        assert (entry.state, entry.ended) == (State.DENIED, Outcome(Decided.DENY, "root", 0, "no"))
        assert table.settle_open(entry, Outcome(event, "late")) is False  # a race lost is no error
        assert await table.outcome(entry, 1) == Outcome(Decided.DENY, "root", 0, "no")

    asyncio.run(scenario())


def test_an_allow_is_shared_with_the_attached_requests_in_the_same_call_and_a_solo_cancel_is_not() -> None:
    async def scenario() -> None:
        leader, second, third = (
            _entry("r-1", 1),
            _entry("r-2", 2, (PEER.uid, "r-1")),
            _entry("r-3", 3, (PEER.uid, "r-1")),
        )
        table = _table(leader, second, third)
        table.settle(leader, Outcome(Decided.ALLOW, "root", 0))
        assert [e.state for e in (leader, second, third)] == [State.ALLOWED] * 3
        assert second.decided_with == "r-1" and table.promote(leader) is None

        leader, second, third = (
            _entry("r-1", 1),
            _entry("r-2", 2, (PEER.uid, "r-1")),
            _entry("r-3", 3, (PEER.uid, "r-1")),
        )
        table = _table(leader, second, third)
        leader.solo = True  # an operator's cancel of one operation
        table.settle(leader, Outcome(Decided.DENY, "root", 0, "cancelled"))
        assert table.is_open(second) and table.is_open(third)
        assert table.promote(leader) is second and second.attached_to is None
        assert third.attached_to == (PEER.uid, "r-2")

    asyncio.run(scenario())


def test_nobody_deciding_in_time_settles_it_as_timed_out_and_an_interrupt_ends_the_rest() -> None:
    async def scenario() -> None:
        slow, other = _entry("r-1"), _entry("r-2")
        table = _table(slow, other)
        assert await table.outcome(slow, 0.05) == Outcome(Decided.TIMEOUT, "timeout")
        assert slow.state is State.TIMED_OUT
        table.interrupt_all()
        assert (other.state, slow.state) == (State.INTERRUPTED, State.TIMED_OUT)

    asyncio.run(scenario())


def test_no_code_outside_the_table_touches_a_pending_requests_outcome() -> None:
    """Only table.py settles: it alone reaches `_waiter` and sets `state`/`ended` (pending.py declares them)."""
    offenders = []
    for path in sorted(APPROVAL.rglob("*.py")):
        if path.name in ("table.py", "pending.py", "transitions.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("_waiter", "future"):
                offenders.append(f"{path.name}:{node.lineno}: .{node.attr}")
            for target in node.targets if isinstance(node, ast.Assign) else []:
                if isinstance(target, ast.Attribute) and target.attr in ("ended", "_waiter"):
                    offenders.append(f"{path.name}:{target.lineno}: sets .{target.attr}")
            # Other futures (an enrollment's `done`) are not a request's outcome.
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "set_result"
                and ast.unparse(node.value)[-5:] != ".done"
            ):
                offenders.append(f"{path.name}:{node.lineno}: .set_result")
    assert offenders == [], offenders


def test_the_spin_model_tags_the_same_moves_and_leaves_pending_once_each_time() -> None:
    """model/airlock.pml marks each way a pending request ends with ``table: EVENT…``; they are the table's."""
    lines = (REPO / "model" / "airlock.pml").read_text().splitlines()
    tagged: set[str] = set()
    for n, line in enumerate(lines):
        found = re.search(r"table: ([a-z ]+) \*/", line)
        if not found:
            continue
        tagged |= set(found.group(1).split())
        # The move leaves pending in the same step: the nearest a_pending assignment above it clears it.
        above = next(lines[k] for k in range(n, -1, -1) if re.search(r"a_pending\[\w+\] = ", lines[k]))
        assert re.search(r"a_pending\[\w+\] = 0", above), (n + 1, line)
    assert tagged == {event.value for (_state, event) in MOVES}


def test_the_parts_that_decide_take_the_table_and_a_few_holders_not_a_dozen_collaborators() -> None:
    import inspect

    from airlock.approval.decide import Deciding
    from airlock.approval.operator import Operating
    from airlock.approval.votes import Votes

    for part in (Deciding, Operating, Votes):
        params = list(inspect.signature(part.__init__).parameters)[1:]
        assert len(params) <= 6 and "pending" in params, (part.__name__, params)
