"""Quorum (issues 18, 27): distinct persons, the requester never counts, approvers restrict, reasons measured."""

from __future__ import annotations

import pytest

from airlock.approval.policyfile import parse_policy_text
from airlock.approval.quorum import Approvers, Requirement, Tally, Voter, VoteRefused, join, reason_problem


def tally(approvals: int = 2, approvers: tuple[Approvers, ...] = ()) -> Tally:
    return Tally(Requirement(approvals, approvers), requester_uid=1000, requester_user="agent")


def signed(uid: int | None, user: str, principal: str, fingerprint: str) -> Voter:
    """A signed vote: ``uid``/``user`` the account approval.signer_accounts maps the principal to (None: unmapped)."""
    return Voter(uid, user, principal=principal, fingerprint=fingerprint, carrier_uid=1000, carrier_user="agent")


ALICE_KEY = signed(1001, "alice", "alice@example.org", "SHA256:a")


def test_two_distinct_persons_meet_a_quorum_of_two() -> None:
    t = tally()
    bob = Voter(0, "root")
    t.check(ALICE_KEY, self_approval=False)
    assert t.add(ALICE_KEY) is False and t.progress() == "1 of 2"
    t.check(bob, self_approval=False)
    assert t.add(bob) is True and t.progress() == "2 of 2"


@pytest.mark.parametrize(
    "second",
    [
        signed(1001, "alice", "alice@example.org", "SHA256:other-key"),  # alice's second key
        signed(1001, "alice", "alice-laptop", "SHA256:b"),  # another principal mapped to alice's account
        Voter(1001, "alice"),  # alice by uid on operator.sock
        signed(1002, "bob", "bob@example.org", "SHA256:a"),  # the same key under another name
    ],
)
def test_the_same_person_counts_once_however_they_vote(second: Voter) -> None:
    t = tally()
    t.add(ALICE_KEY)
    with pytest.raises(VoteRefused, match="already approved"):
        t.check(second, self_approval=False)


def test_a_uid_vote_then_a_signed_vote_of_the_same_person_is_one() -> None:
    t = tally()
    t.add(Voter(1001, "alice"))
    with pytest.raises(VoteRefused, match="same person"):
        t.check(ALICE_KEY, self_approval=True)


def test_the_same_operator_uid_counts_once() -> None:
    t = tally()
    t.add(Voter(0, "root"))
    with pytest.raises(VoteRefused):
        t.check(Voter(0, "root"), self_approval=True)


def test_the_requester_never_counts_towards_a_quorum_even_with_self_approval() -> None:
    with pytest.raises(VoteRefused, match="requester"):
        tally().check(Voter(1000, "agent"), self_approval=True)
    # By key: the principal's account is the requester's (issue 27: it was compared with the user name).
    own_key = signed(1000, "agent", "op@example.org", "SHA256:x")
    with pytest.raises(VoteRefused, match="requester"):
        tally().check(own_key, self_approval=True)
    tally(1).check(Voter(1000, "agent"), self_approval=True)  # one approval: allow_self_approval still decides
    tally(1).check(own_key, self_approval=True)


def test_self_approval_by_key_is_refused_without_allow_self_approval() -> None:
    with pytest.raises(VoteRefused, match="own requests") as info:
        tally(1).check(signed(1000, "agent", "op@example.org", "SHA256:x"), self_approval=False)
    assert info.value.code == "unauthorized"
    tally(1).check(ALICE_KEY, self_approval=False)  # control: another person's key counts


def test_an_unmapped_principal_counts_only_where_no_check_needs_the_person() -> None:
    stranger = signed(None, "carol@example.org", "carol@example.org", "SHA256:c")
    for t, self_approval in ((tally(2), True), (tally(1), False)):
        with pytest.raises(VoteRefused, match="no operator account") as info:
            t.check(stranger, self_approval=self_approval)
        assert info.value.code == "signer_unknown"
    tally(1).check(stranger, self_approval=True)


def test_approvers_restrict_who_counts() -> None:
    rule = Approvers(users=frozenset({"ops1"}), groups=frozenset({"sre"}), principals=frozenset({"alice"}))
    t = tally(approvers=(rule,))
    t.check(Voter(5, "ops1"), self_approval=False)
    t.check(Voter(6, "x", groups=frozenset({"sre"})), self_approval=False)
    t.check(signed(7, "al", "alice", "f"), self_approval=False)  # admitted by its principal
    t.check(signed(5, "ops1", "ops1-key", "k"), self_approval=False)  # a person admitted by account, however they vote
    for stranger in (
        Voter(7, "eve"),
        signed(8, "bob", "bob", "g"),
        signed(None, "ops1", "ops1", "h"),  # unmapped: only its principal could admit it
    ):
        with pytest.raises(VoteRefused, match=r"not among|no operator account"):
            t.check(stranger, self_approval=False)


def test_a_pipeline_joins_its_rules_requirements() -> None:
    a, b = Approvers(users=frozenset({"x"})), Approvers(principals=frozenset({"p"}))
    joined = join([(2, a, False), (3, None, True), (1, b, False)])
    assert joined == Requirement(3, (a, b), True)
    assert join([]) == Requirement()


@pytest.mark.parametrize(
    ("reason", "ok"), [(None, False), ("", False), ("   short   ", False), ("  ten chars!  ", True)]
)
def test_a_reason_is_measured_after_trimming(reason: str | None, ok: bool) -> None:
    assert (reason_problem(reason, 10) is None) is ok


def test_policy_reads_approvals_approvers_and_reason() -> None:
    text = (
        "rules:\n"
        "  - name: pair\n    decision: ask\n    approvals: 2\n    approvers: "
        "{users: [ops1, 0], groups: [sre], principals: [alice]}\n"
        "  - name: why\n    decision: allow\n    reason: required\n"
    )
    rules = {r.name: r for r in parse_policy_text(text, "/p.yaml", main=False).rules}
    assert rules["pair"].approvals == 2 and rules["pair"].approvers == Approvers(
        frozenset({"ops1", "0"}), frozenset({"sre"}), frozenset({"alice"})
    )
    assert rules["why"].reason_required and rules["why"].approvals == 1
    assert rules["pair"].to_dict()["approvals"] == 2 and rules["why"].to_dict()["reason"] == "required"


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("decision: allow\n    approvals: 2", "rules[0] (r).approvals: applies only to a rule with decision: ask"),
        (
            "decision: ask\n    approvals: 0",
            "rules[0] (r).approvals: expected a number of approvers from 1 to 16 (got '0')",
        ),
        ("decision: ask\n    approvals: '2'", "expected a number of approvers"),
        (
            "decision: ask\n    approvers: {people: [x]}",
            "rules[0] (r).approvers.people: unknown key (known: groups, principals, users)",
        ),
        ("decision: ask\n    approvers: {}", "rules[0] (r).approvers: must name users, groups or principals"),
        ("decision: ask\n    reason: please", "rules[0] (r).reason: must be required or optional (got 'please')"),
    ],
)
def test_bad_quorum_keys_are_reported_with_their_place(rule: str, message: str) -> None:
    from airlock.approval.policyfile import PolicyError

    with pytest.raises(PolicyError) as info:
        parse_policy_text(f"rules:\n  - name: r\n    {rule}\n", "/p.yaml", main=False)
    assert message in info.value.errors[0]
