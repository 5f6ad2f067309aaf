"""Quorum and reasons (issue 18): what a pending request needs before its ticket is issued.

A rule may ask for ``approvals: N`` distinct approvers, restrict who counts
(``approvers: {users, groups, principals}``) and require the agent's
``reason``.  A pipeline's requirement joins its stages' deciding rules: the
largest N, a reason if any rule wants one, and a vote counts only if every
rule's ``approvers`` admits it.  A vote is a person's (issue 27): an
operator by uid, or a signer whose OpenSSH principal maps to an operator
account (``approval.signer_accounts``).  The same person never counts twice,
however they voted (by uid, by any of their keys), nor does the same key;
the requester never counts when more than one approval is needed (nor at all
without ``allow_self_approval``), whether by uid or by key; a principal
mapped to no account counts only where neither check applies; one deny
denies.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Approvers:
    """Who may count towards a rule's quorum; a field left out admits nobody by that route."""

    users: frozenset[str] = frozenset()  # names or decimal uids
    groups: frozenset[str] = frozenset()
    principals: frozenset[str] = frozenset()

    def admits(self, voter: Voter) -> bool:
        if voter.principal is not None and voter.principal in self.principals:
            return True
        if voter.uid is None:  # a principal mapped to no account is only admitted by its principal
            return False
        if voter.user in self.users or str(voter.uid) in self.users:
            return True
        return bool(self.groups & voter.groups)

    def to_dict(self) -> dict[str, list[str]]:
        return {k: sorted(getattr(self, k)) for k in ("users", "groups", "principals") if getattr(self, k)}


@dataclass(frozen=True, slots=True)
class Voter:
    """Who approved or denied: a person, by uid on operator.sock or by a key (principal set).

    ``uid`` and ``user`` are the person's account: the operator's own, or
    the account ``approval.signer_accounts`` maps the signer's principal to
    (None and the principal when unmapped).  Whoever carried a signature
    (an agent, or another operator) is the carrier, not a voter.
    """

    uid: int | None
    user: str
    groups: frozenset[str] = frozenset()
    principal: str | None = None
    fingerprint: str | None = None
    carrier_uid: int | None = None  # who submitted the signature (agent or operator), if signed
    carrier_user: str | None = None

    @property
    def key(self) -> str:
        """The person: one per account, however they voted."""
        return f"uid:{self.uid}" if self.uid is not None else f"principal:{self.principal}"

    @property
    def label(self) -> str:
        if self.principal is None:
            return self.user
        if self.uid is None:
            return f"{self.principal} ({self.fingerprint})"
        return f"{self.user} (key {self.principal} {self.fingerprint})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"user": self.user, "uid": self.uid}
        if self.principal is not None:
            out |= {"principal": self.principal, "fingerprint": self.fingerprint}
            out["carrier"] = {"uid": self.carrier_uid, "user": self.carrier_user}
        return out


@dataclass(frozen=True, slots=True)
class Requirement:
    approvals: int = 1
    approvers: tuple[Approvers, ...] = ()  # every one must admit a vote
    reason: bool = False  # the request must carry a reason

    def admits(self, voter: Voter) -> bool:
        return all(a.admits(voter) for a in self.approvers)

    def to_dict(self) -> dict[str, Any]:
        return {"approvals": self.approvals, "approvers": [a.to_dict() for a in self.approvers], "reason": self.reason}


def join(parts: Iterable[tuple[int, Approvers | None, bool]]) -> Requirement:
    """One requirement from the deciding rules' (approvals, approvers, reason required)."""
    approvals, approvers, reason = 1, [], False
    for count, admitted, wants_reason in parts:
        approvals = max(approvals, count)
        if admitted is not None and admitted not in approvers:
            approvers.append(admitted)
        reason = reason or wants_reason
    return Requirement(approvals, tuple(approvers), reason)


def reason_problem(reason: str | None, minimum: int) -> str | None:
    """Why a reason is not enough (None: it is): at least ``minimum`` characters once trimmed."""
    text = (reason or "").strip()
    if len(text) < minimum:
        return f"a reason of at least {minimum} characters is required (got {len(text)})"
    return None


class VoteRefused(Exception):
    """A vote that does not count: ``code`` is the error code's value (`conflict` unless said otherwise)."""

    def __init__(self, why: str, code: str = "conflict") -> None:
        super().__init__(why)
        self.code = code


@dataclass(slots=True)
class Tally:
    """The approvals a pending request collected so far."""

    requirement: Requirement
    requester_uid: int
    requester_user: str
    votes: list[Voter] = field(default_factory=list)

    def check(self, voter: Voter, *, self_approval: bool) -> None:
        """Raise `VoteRefused` if ``voter``'s approval may not count."""
        if voter.uid is None and (self.requirement.approvals > 1 or not self_approval):
            # Whose key it is is unknown: it could be the requester's, or a second key of an approver's.
            raise VoteRefused(
                f"principal {voter.principal!r} maps to no operator account (approval.signer_accounts): "
                "its signature counts only where no quorum and no self-approval check applies",
                "signer_unknown",
            )
        if voter.uid == self.requester_uid:
            if not self_approval:
                raise VoteRefused("operators cannot approve their own requests", "unauthorized")
            if self.requirement.approvals > 1:
                raise VoteRefused("the requester never counts towards the approvals")
        if not self.requirement.admits(voter):
            raise VoteRefused(f"{voter.label} is not among this rule's approvers")
        for vote in self.votes:
            if vote.key == voter.key or (voter.fingerprint is not None and vote.fingerprint == voter.fingerprint):
                raise VoteRefused(f"{vote.label} already approved; a second approval by the same person does not count")

    def add(self, voter: Voter) -> bool:
        """Count an approval (checked first); True once the quorum is met."""
        self.votes.append(voter)
        return self.met

    @property
    def met(self) -> bool:
        return len(self.votes) >= self.requirement.approvals

    def progress(self) -> str:
        return f"{len(self.votes)} of {self.requirement.approvals}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "approvals": len(self.votes),
            "needed": self.requirement.approvals,
            "progress": self.progress(),
            "approvers": [v.to_dict() for v in self.votes],
            "requirement": self.requirement.to_dict(),
        }
