"""intake's ``decide`` in approval itself, without a stack: what each verdict journals and answers.

The journal is a recording stand-in (it is the subject of its own tests);
the policy, the binaries bound to the ticket, the hold, the grants and the
tickets are approval's real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from airlock.approval.grants import Grant
from airlock.approval.rules import Policy, Rule
from airlock.approval.service import Approval
from airlock.approval.transitions import Outcome
from airlock.approval.verdict import Decided
from airlock.common.audit import Ids
from airlock.common.config import load
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire
from airlock.common.wire.verb import Caller

AGENT = Peer(uid=4242, gid=4242, pid=7, user="agent", groups=frozenset({"agent"}), group_ids=(4242,))
OPERATOR = Peer(uid=0, gid=0, pid=1, user="root", groups=frozenset({"root"}), group_ids=(0,))


class Journal:
    """Records what approval journals; a deferred record gets a mark."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str | None, dict[str, Any], bool]] = []

    async def record(self, kind: str, ids: Ids | None = None, *, payload: dict[str, Any], **_: Any) -> None:
        self.records.append((kind, ids.request_id if ids else None, payload, True))

    async def defer(self, kind: str, ids: Ids | None = None, *, payload: dict[str, Any], **_: Any) -> str:
        self.records.append((kind, ids.request_id if ids else None, payload, False))
        return f"mark-{len(self.records)}"

    def decided(self) -> list[dict[str, Any]]:
        return [p for kind, _r, p, _d in self.records if kind == "approval.decided"]


class Connection:
    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def wait_gone(self) -> None:
        await self.gone.wait()


class FakeCall:
    def __init__(self, args: dict[str, Any], peer: Peer = OPERATOR) -> None:
        self.args = args
        self.peer = peer
        self.connection = Connection()
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def emit(self, event: str, fields: dict[str, Any]) -> None:
        self.events.append((event, fields))


def rule(name: str, decision: str, **extra: Any) -> Rule:
    return Rule(name, decision, frozenset(), frozenset(), frozenset(), None, None, "test:1", **extra)  # type: ignore[arg-type]


def approval(tmp_path: Path, *rules: Rule, default: str = "deny") -> tuple[Approval, Journal]:
    empty = tmp_path / "airlock.yaml"
    empty.write_text("")
    journal = Journal()
    a = Approval(load(empty), Policy(default=default, rules=rules, sources=()), None, journal)  # type: ignore[arg-type]
    a.book.hold_reason = None
    a.reviewing.memory.known = True  # as restored at start: no denials
    a.book._hold_known.set()
    return a, journal


def spec(*argv: str) -> ExecSpec:
    return ExecSpec(mode="exec", stages=(argv or ("/usr/bin/true",),), privileged=False, uid=AGENT.uid)


def asking(request_id: str, s: ExecSpec, **request: Any) -> FakeCall:
    body = {"request_id": request_id} | request
    return FakeCall({"request": body, "spec": s.to_dict(), "peer": AGENT.to_dict(), "operation_id": f"op-{request_id}"})


async def decide(a: Approval, call: FakeCall) -> dict[str, Any]:
    return (await a.deciding.decide(call, wire.Decide.from_dict(call.args))).to_dict()  # type: ignore[arg-type]


async def redeem(a: Approval, reply: dict[str, Any], s: ExecSpec) -> dict[str, Any]:
    args = wire.Redeem(reply["ticket"], s.digest(), reply["bound"])
    return (await a.book.redeem(FakeCall({}), args)).to_dict()  # type: ignore[arg-type]


async def until_pending(a: Approval, request_id: str) -> None:
    async with asyncio.timeout(5):
        while (AGENT.uid, request_id) not in a.pending:
            await asyncio.sleep(0)


def test_a_rules_allow_is_deferred_and_its_ticket_redeems_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("ok", "allow"))
        s = spec()
        reply = await decide(a, asking("r-1", s))
        assert (reply["decision"], reply["rule"], reply["decided_by"]) == ("allow", "ok", "policy")
        assert reply["bound"]["binaries"][0]["path"] == "/usr/bin/true"  # the binary bound to the ticket
        [(kind, request_id, payload, durable)] = journal.records
        assert (kind, request_id, payload["decision"], payload["by"], durable) == (
            "approval.decided",
            "r-1",
            "allow",
            "policy",
            False,  # deferred (issue 21): durable with the runner's exec.started
        )
        assert reply["mark"] == "mark-1"
        assert (await redeem(a, reply, s))["mark"] == "mark-1"
        with pytest.raises(AirlockError) as again:
            await redeem(a, reply, s)
        assert again.value.code is ErrorCode.INVALID_TICKET  # single use

    asyncio.run(scenario())


def test_a_ticket_is_bound_to_the_spec_it_was_issued_for(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, _journal = approval(tmp_path, rule("ok", "allow"))
        reply = await decide(a, asking("r-1", spec()))
        with pytest.raises(AirlockError) as other:
            await redeem(a, reply, spec("/usr/bin/false"))
        assert other.value.code is ErrorCode.INVALID_TICKET

    asyncio.run(scenario())


def test_a_policy_deny_is_journaled_durably_and_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("no", "deny"))
        with pytest.raises(AirlockError) as denied:
            await decide(a, asking("r-1", spec()))
        assert denied.value.code is ErrorCode.DENIED and denied.value.details["rule"] == "no"
        [(kind, _r, payload, durable)] = journal.records
        assert (kind, payload["decision"], payload["by"], durable) == ("approval.decided", "deny", "policy", True)
        assert not a.book.tickets

    asyncio.run(scenario())


def test_a_request_that_names_another_agent_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("ok", "allow"))
        call = asking("r-1", ExecSpec(mode="exec", stages=(("/usr/bin/true",),), privileged=False, uid=1))
        with pytest.raises(AirlockError) as refused:
            await decide(a, call)
        assert refused.value.code is ErrorCode.INVALID_ARGUMENTS and refused.value.details["field"] == "peer"
        assert journal.records == [] and not a.book.tickets

    asyncio.run(scenario())


def test_a_missing_required_reason_is_denied_before_anyone_is_asked(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("why", "ask", reason_required=True))
        with pytest.raises(AirlockError) as refused:
            await decide(a, asking("r-1", spec(), reason="x"))
        assert refused.value.code is ErrorCode.REASON_REQUIRED
        [payload] = journal.decided()
        assert (payload["decision"], payload["code"]) == ("deny", "reason_required")
        assert not a.pending and not [r for r in journal.records if r[0] == "approval.pending"]

    asyncio.run(scenario())


def test_during_the_hold_a_rules_allow_waits_and_the_release_lets_it_go(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("ok", "allow"))
        a.book.hold_reason = "maintenance"
        call = asking("r-1", spec())
        waiting = asyncio.ensure_future(decide(a, call))
        await until_pending(a, "r-1")
        assert a.pending[(AGENT.uid, "r-1")].rule == "hold"
        assert call.events[0][0] == "pending_approval" and call.events[0][1]["rule"] == "hold"
        released = await a.book.release(FakeCall({}))  # type: ignore[arg-type]
        assert released["released"] == ["r-1"]
        reply = await waiting
        assert (reply["decision"], reply["rule"]) == ("allow", "hold")
        assert journal.decided()[-1]["by"].startswith("release by ")

    asyncio.run(scenario())


def test_a_grant_stands_in_for_one_use_then_people_decide(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("asks", "ask"))
        s = spec()
        a.grants.schedule(
            Grant("g-1", AGENT.uid, None, "command", s.digest(), "asks", 1e12, "root", "r-0", "true", uses=1)
        )
        reply = await decide(a, asking("r-1", s))
        assert (reply["decision"], reply["decided_by"]) == ("allow", "grant g-1")
        payload = journal.decided()[0]
        assert (payload["by"], payload["grant_use"], payload["grant_uses"]) == ("grant", 1, 1)
        ended = [p for kind, _r, p, _d in journal.records if kind == "operator.action"]
        assert [(p["action"], p["used"]) for p in ended] == [("grant.exhausted", 1)]
        assert a.grants.live(0) == []
        # Used up: the next identical request asks a person.
        second = asyncio.ensure_future(decide(a, asking("r-2", s)))
        await until_pending(a, "r-2")
        a.pending.settle(a.pending[(AGENT.uid, "r-2")], Outcome(Decided.DENY, "root", 0, "no"))
        with pytest.raises(AirlockError) as denied:
            await second
        assert denied.value.code is ErrorCode.DENIED

    asyncio.run(scenario())


def test_an_ask_waits_for_an_operator_and_times_out_unanswered(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("asks", "ask"))
        a.config = dataclasses.replace(a.config, approval=dataclasses.replace(a.config.approval, timeout_seconds=0.05))
        with pytest.raises(AirlockError) as late:
            await decide(a, asking("r-1", spec()))
        assert late.value.code is ErrorCode.APPROVAL_TIMEOUT
        assert [r[0] for r in journal.records] == ["approval.pending", "approval.decided"]
        assert journal.decided()[0]["decision"] == "timeout" and not a.pending

    asyncio.run(scenario())


def test_the_internal_door_serves_its_declared_verbs_each_to_its_declared_caller(tmp_path: Path) -> None:
    from airlock.approval import service as approval_service
    from airlock.common.wire.verb import declared

    config_file = tmp_path / "airlock.yaml"
    config_file.write_text(f"paths:\n  runtime_dir: {tmp_path}\n  policy_dir: {tmp_path / 'policy.d'}\n")
    service = asyncio.run(approval_service.build(load(config_file), {}))
    verbs = service.doors["approval"].verbs
    assert (
        set(verbs)
        == set(declared(wire.DOOR))
        == {
            "decide",
            "explain",
            "redeem",
            "token.check",
            "withdraw",
            "approve_signed",
        }
    )
    # The built door refuses a caller the declaration does not name, before reading its arguments:
    # the runner (root here) asking for a decision, an agent's uid redeeming a ticket.
    by_runner = asking("r-1", spec())
    by_runner.peer = OPERATOR
    for verb, call in (("decide", by_runner), ("redeem", FakeCall({}, AGENT))):
        with pytest.raises(AirlockError) as refused:
            asyncio.run(verbs[verb](call))  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.UNAUTHORIZED, verb
    caller_of = approval_service.internal_caller(intake_uid=100, runner_uid=0)
    intake = Peer(uid=100, gid=100, pid=2, user="airlock-intake", groups=frozenset(), group_ids=(100,))
    assert caller_of(intake) == {Caller.INTAKE} and caller_of(OPERATOR) == {Caller.RUNNER}
    assert caller_of(AGENT) == frozenset()


def test_a_runner_cannot_ask_for_a_decision_nor_intake_redeem_a_ticket(tmp_path: Path) -> None:
    from airlock.approval import service as approval_service
    from airlock.common.wire.verb import serve

    a, journal = approval(tmp_path, rule("ok", "allow"))
    intake = Peer(uid=100, gid=100, pid=2, user="airlock-intake", groups=frozenset(), group_ids=(100,))
    runner = OPERATOR  # root
    table = serve(
        wire.DOOR,
        {
            wire.DECIDE: a.deciding.decide,
            wire.EXPLAIN: a.deciding.decide,  # only the door's shape matters here
            wire.REDEEM: a.book.redeem,
            wire.TOKEN_CHECK: a.sessions.check,
            wire.WITHDRAW: a.deciding.withdraw,
            wire.APPROVE_SIGNED: a.votes.approve_signed,
        },
        caller_of=approval_service.internal_caller(intake_uid=100, runner_uid=0),
    )

    async def scenario() -> None:
        by_runner = asking("r-1", spec())
        by_runner.peer = runner
        with pytest.raises(AirlockError) as refused:
            await table["decide"](by_runner)  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.UNAUTHORIZED and journal.records == []
        by_intake = asking("r-2", spec())
        by_intake.peer = intake
        reply = await table["decide"](by_intake)  # type: ignore[arg-type]
        redeem = FakeCall({"ticket": reply["ticket"], "digest": spec().digest(), "bound": reply["bound"]}, intake)
        with pytest.raises(AirlockError) as refused:
            await table["redeem"](redeem)  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.UNAUTHORIZED
        redeem.peer = runner
        assert (await table["redeem"](redeem))["valid"] is True  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_a_withdrawal_names_only_the_agents_own_request_and_ends_its_wait(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, journal = approval(tmp_path, rule("asks", "ask"))
        waiting = asyncio.ensure_future(decide(a, asking("r-1", spec())))
        await until_pending(a, "r-1")
        other = await a.deciding.withdraw(FakeCall({}), wire.Withdraw("r-1", AGENT.uid + 1))  # type: ignore[arg-type]
        assert other.withdrawn is False and (AGENT.uid, "r-1") in a.pending  # another agent's ID: nothing
        own = await a.deciding.withdraw(FakeCall({}), wire.Withdraw("r-1", AGENT.uid))  # type: ignore[arg-type]
        assert own.withdrawn is True and (AGENT.uid, "r-1") not in a.pending
        with pytest.raises(AirlockError) as gone:
            await waiting
        assert gone.value.code is ErrorCode.WITHDRAWN
        assert journal.decided()[-1]["decision"] == "withdrawn"

    asyncio.run(scenario())


def test_explain_answers_a_missing_program_with_a_null_binary_that_decodes(tmp_path: Path) -> None:
    from airlock.approval import explain

    a, journal = approval(tmp_path, rule("ok", "allow"))
    s = spec("sytemctl")
    args = wire.Explain.from_dict({"request": {"request_id": "r-1"}, "spec": s.to_dict(), "peer": AGENT.to_dict()})
    answer = asyncio.run(explain.explain(a, FakeCall({}), args))  # type: ignore[arg-type]
    encoded = answer.to_dict()
    assert encoded["stages"][0]["binary"] is None  # documented: null when nothing is found
    assert wire.Explained.from_dict(encoded) == answer  # what intake decodes
    assert journal.records == []  # asking is not doing


def test_explain_after_a_cold_start_waits_for_the_hold_to_be_restored(tmp_path: Path) -> None:
    """Issue 44: `airlock can` said "on hold" after every start although nobody held anything."""
    from airlock.approval import explain
    from airlock.common.wire.journal import Found

    a, _journal = approval(tmp_path, rule("ok", "allow"))
    a.book.hold_reason = "restoring the hold state from the journal"  # as a fresh start has it
    a.book._hold_known.clear()

    class NeverHeld:
        async def call(self, *_: Any, **__: Any) -> Found:
            await asyncio.sleep(0.05)  # the journal answers a moment after the first `can` arrives
            return Found(records=())

    a.book.journal = NeverHeld()  # type: ignore[assignment]
    s = spec("/usr/bin/true")
    args = wire.Explain.from_dict({"request": {"request_id": "r-1"}, "spec": s.to_dict(), "peer": AGENT.to_dict()})

    async def scenario() -> wire.Explained:
        asking = asyncio.create_task(explain.explain(a, FakeCall({}), args))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await a.book.restore_hold()
        return await asking

    answer = asyncio.run(scenario())
    assert answer.held is False and answer.decision == "allow"
