"""The verdict on a request: the one place that says what the policy, the hold, a grant and the votes add up to.

`verdict` is called by ``decide`` (a request arrives: the policy's decision,
the hold, a live grant, the rule's requirement) and by the operators' path
(the hold is released: a request the hold alone kept waiting goes; votes
arrive: a deny decides, a quorum of approvals allows).  It does no I/O and
keeps no state: what it returns is journaled and acted on by its caller.

`Decided` is the closed set of what a request's ``approval.decided`` says
(allow, deny, or how a wait ended); `By` says who decided, in the terms of
the rule of thumb an operator reads in the journal.

Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from airlock.approval.grants import Grant
from airlock.approval.quorum import Requirement
from airlock.approval.rules import Decision

HOLD_RULE = "hold"  # the pseudo-rule a held request is pending under


class Decided(enum.StrEnum):
    """What ``approval.decided`` says of a request (one registry: these values and no others)."""

    ALLOW = "allow"
    ASK = "ask"  # not decided yet: people (or a quorum) decide
    DENY = "deny"
    TIMEOUT = "timeout"  # nobody decided within approval.timeout_seconds
    WITHDRAWN = "withdrawn"  # the agent went away or cancelled
    INTERRUPTED = "interrupted"  # approval stopped while it was pending


class Publication(enum.StrEnum):
    """Where a request's published statements stand in the ledger of signed approvals (approval/signed.py)."""

    PENDING = "pending"  # a signature over them may still decide
    DECIDED = "decided"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"
    INTERRUPTED = "interrupted"


# How a pending request that no person decided ended, as the ledger of statements remembers it.
LEDGER_STATE: dict[str, Publication] = {
    Decided.TIMEOUT: Publication.EXPIRED,
    Decided.WITHDRAWN: Publication.WITHDRAWN,
    Decided.INTERRUPTED: Publication.INTERRUPTED,
}


class By(enum.StrEnum):
    """Who a verdict is: the policy's rule, a grant standing in for an operator, or people's votes."""

    POLICY = "policy"
    GRANT = "grant"
    PEOPLE = "people"  # an operator, or a quorum of approvers
    NOBODY = "nobody"  # still asking


@dataclass(frozen=True, slots=True)
class Votes:
    """The votes counted on a pending request so far: approvals (distinct people) and whether one denied."""

    approvals: int = 0
    denied: bool = False


NO_VOTES = Votes()


@dataclass(frozen=True, slots=True)
class Ruling:
    """A verdict: what it is, under which rule (``hold`` while held), by whom; ``problem`` for a missing reason."""

    decided: Decided
    rule: str
    by: By
    grant: Grant | None = None  # the grant that stands in (by GRANT): its caller takes one use
    problem: str | None = None  # a rule's ``reason: required`` not met (denied: reason_required)


def verdict(
    decision: Decision,
    hold: bool,
    grant: Grant | None,
    requirement: Requirement,
    votes: Votes = NO_VOTES,
    *,
    reason_problem: str | None = None,
    changeable: bool = False,
    command: bool = True,
) -> Ruling:
    """What the policy's ``decision`` comes to, given the hold, a live ``grant`` that covers the request,
    the deciding rules' ``requirement`` and the ``votes`` counted so far.

    ``reason_problem``: why the request's own reason does not meet a rule's
    ``reason: required`` (None: it does, or none is required).
    ``changeable``: a root job's path argument someone other than root can
    change (issue 27): no grant stands in for a person then.  ``command``:
    an exec, not a file operation (grants cover commands only).

    The order is the security argument: a policy deny is final; a missing
    required reason denies before anyone is asked; one person's deny
    decides; during the hold nothing automatic allows (a rule's allow asks,
    under the pseudo-rule ``hold``, and no grant stands in); a quorum of
    approvals allows; a grant stands in only for a plain one-person ``ask``.
    """
    rule = decision.rule
    if decision.decision == "deny":
        return Ruling(Decided.DENY, rule, By.POLICY)
    if reason_problem is not None and requirement.reason:
        return Ruling(Decided.DENY, rule, By.POLICY, problem=reason_problem)
    if votes.denied:
        return Ruling(Decided.DENY, HOLD_RULE if hold and decision.decision == "allow" else rule, By.PEOPLE)
    if decision.decision == "allow":
        if hold:
            rule = HOLD_RULE
        elif requirement.approvals <= 1:
            return Ruling(Decided.ALLOW, rule, By.POLICY)
    if votes.approvals and votes.approvals >= requirement.approvals:
        return Ruling(Decided.ALLOW, rule, By.PEOPLE)
    if (
        grant is not None
        and not hold
        and decision.decision == "ask"
        and not changeable
        and command
        and requirement.approvals <= 1
    ):
        return Ruling(Decided.ALLOW, rule, By.GRANT, grant=grant)
    return Ruling(Decided.ASK, rule, By.NOBODY)


def asking_rules(decision: Decision) -> Sequence[str]:
    """Every rule that decided an asking stage (issue 27: not only the one whose name sorts first): a
    grant for scope ``rule`` must cover them all."""
    return [name for s in decision.stages if s.decision != "allow" for name in (s.deciding or (s.rule,))]
