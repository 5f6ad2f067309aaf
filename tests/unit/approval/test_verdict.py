"""`approval.verdict`: what the policy, the hold, a grant, the requirement and the votes add up to (pure)."""

from __future__ import annotations

import pytest

from airlock.approval.grants import Grant
from airlock.approval.quorum import Requirement
from airlock.approval.rules import Decision, StageDecision
from airlock.approval.verdict import HOLD_RULE, By, Decided, Votes, asking_rules, verdict

ONE = Requirement()
TWO = Requirement(approvals=2)
WITH_REASON = Requirement(reason=True)
GRANT = Grant(
    grant_id="g-1",
    uid=1000,
    session=None,
    scope="command",
    digest="d",
    rule="r",
    expires=1e12,
    made_by="root",
    request_id="q",
    command="true",
)


def policy(decision: str, rule: str = "r") -> Decision:
    return Decision(decision, rule, ())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("decision", "hold", "expected"),
    [
        ("allow", False, (Decided.ALLOW, "r", By.POLICY)),
        ("allow", True, (Decided.ASK, HOLD_RULE, By.NOBODY)),  # the brake: a rule's allow waits for a person
        ("ask", False, (Decided.ASK, "r", By.NOBODY)),
        ("ask", True, (Decided.ASK, "r", By.NOBODY)),
        ("deny", False, (Decided.DENY, "r", By.POLICY)),
        ("deny", True, (Decided.DENY, "r", By.POLICY)),
    ],
)
def test_the_policy_and_the_hold(decision: str, hold: bool, expected: tuple[Decided, str, By]) -> None:
    ruling = verdict(policy(decision), hold, None, ONE)
    assert (ruling.decided, ruling.rule, ruling.by) == expected


def test_a_grant_stands_in_for_a_person_only_on_a_plain_ask() -> None:
    assert verdict(policy("ask"), False, GRANT, ONE).by is By.GRANT
    assert verdict(policy("ask"), False, GRANT, ONE).grant is GRANT
    refused = [
        verdict(policy("ask"), True, GRANT, ONE),  # on hold nothing automatic allows
        verdict(policy("ask"), False, GRANT, TWO),  # a quorum rule takes no grant
        verdict(policy("ask"), False, GRANT, ONE, changeable=True),  # issue 27: arguments others can change
        verdict(policy("ask"), False, GRANT, ONE, command=False),  # grants cover commands only
        verdict(policy("deny"), False, GRANT, ONE),  # never over a deny
    ]
    assert all(r.by is not By.GRANT and r.grant is None for r in refused)
    assert [r.decided for r in refused] == [Decided.ASK] * 4 + [Decided.DENY]


def test_a_missing_required_reason_denies_before_anything_else_allows() -> None:
    for decision, hold, grant in (("allow", False, None), ("ask", False, GRANT), ("allow", True, None)):
        ruling = verdict(policy(decision), hold, grant, WITH_REASON, reason_problem="too short")
        assert (ruling.decided, ruling.by, ruling.problem) == (Decided.DENY, By.POLICY, "too short")
    # Only where the rule asks for one; a policy deny stays the policy's own.
    assert verdict(policy("allow"), False, None, ONE, reason_problem="too short").decided is Decided.ALLOW
    assert verdict(policy("deny"), False, None, WITH_REASON, reason_problem="x").problem is None


def test_votes_one_deny_decides_and_a_quorum_allows() -> None:
    assert verdict(policy("ask"), False, None, TWO, Votes(approvals=1)).decided is Decided.ASK
    done = verdict(policy("ask"), False, None, TWO, Votes(approvals=2))
    assert (done.decided, done.by) == (Decided.ALLOW, By.PEOPLE)
    denied = verdict(policy("ask"), False, GRANT, TWO, Votes(approvals=1, denied=True))
    assert (denied.decided, denied.by) == (Decided.DENY, By.PEOPLE)
    # A held rule's allow: a person's approval decides it, under the hold's pseudo-rule.
    held = verdict(policy("allow"), True, None, ONE, Votes(approvals=1))
    assert (held.decided, held.rule, held.by) == (Decided.ALLOW, HOLD_RULE, By.PEOPLE)
    # The policy's deny is final whatever people say.
    assert verdict(policy("deny"), False, None, ONE, Votes(approvals=3)).decided is Decided.DENY


def test_the_grant_covers_every_rule_that_decided_an_asking_stage() -> None:
    stages = (
        StageDecision(("a",), "/bin/a", "allow", "ok", deciding=("ok",)),
        StageDecision(("b",), "/bin/b", "ask", "x", deciding=("x", "y")),
        StageDecision(("c",), "/bin/c", "ask", "z"),
    )
    assert list(asking_rules(Decision("ask", "x", stages))) == ["x", "y", "z"]
