"""Counting one vote on a pending request (issue 18): whether it may count, what it needs, what it decides.

Functions of the settings and the request, shared by every way a person
votes: an operator's approve or deny (`operator`), a signature (`votes`), a
passkey (`passkeys`).  A vote is journaled by its caller between the check
(`check_vote`, `require_operator_reason`) and the count (`count`), which
checks again: a twin vote may have been counted meanwhile.
"""

from __future__ import annotations

from typing import Any

from airlock.approval import quorum
from airlock.approval.pending import Pending
from airlock.approval.table import PendingTable
from airlock.approval.transitions import Outcome
from airlock.approval.verdict import Decided
from airlock.common.config import Approval as ApprovalSettings
from airlock.common.errors import AirlockError, ErrorCode


def check_vote(settings: ApprovalSettings, entry: Pending, voter: quorum.Voter) -> None:
    """A vote that may count on this request (quorum.Tally.check), or the error that says why not."""
    if entry.tally is None:
        return
    try:
        entry.tally.check(voter, self_approval=settings.allow_self_approval)
    except quorum.VoteRefused as exc:
        raise AirlockError(ErrorCode(exc.code), str(exc), {"quorum": entry.tally.progress()}) from None


def progress(entry: Pending, verdict: str) -> dict[str, Any]:
    """What an approve's record says about the quorum: this vote makes it "N of M"."""
    if verdict != "allow" or entry.tally is None:
        return {}
    return {"quorum": f"{len(entry.tally.votes) + 1} of {entry.tally.requirement.approvals}"}


def count(
    settings: ApprovalSettings, table: PendingTable, entry: Pending, verdict: str, voter: quorum.Voter, reason: str
) -> dict[str, Any]:
    """Count a checked, journaled vote: a deny decides, an approval decides once the quorum is met (the
    table settles it)."""
    if not table.is_open(entry):  # another console won while we journaled
        raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
    if verdict == "allow" and entry.tally is not None:
        check_vote(settings, entry, voter)  # again: a twin vote may have been counted while we journaled
        if not entry.tally.add(voter):
            return {"request_id": entry.request_id, "decision": "allow", "complete": False} | entry.tally.to_dict()
        by = ", ".join(v.label for v in entry.tally.votes)
        table.settle(entry, Outcome(Decided.ALLOW, by, voter.uid, reason))
        if entry.tally.requirement.approvals > 1:
            return {"request_id": entry.request_id, "decision": "allow", "complete": True} | entry.tally.to_dict()
        return {"request_id": entry.request_id, "decision": "allow"}
    table.settle(entry, Outcome(Decided(verdict), voter.label, voter.uid, reason))
    return {"request_id": entry.request_id, "decision": verdict}


def require_operator_reason(settings: ApprovalSettings, entry: Pending, reason: str, *, carried: bool = False) -> None:
    """``approval.operator_reason: required``: approving privileged (or another user's) work needs the
    operator's own reason; an agent's never stands for it (issue 27)."""
    if settings.operator_reason != "required":
        return
    if not (entry.privileged or entry.run_as != entry.peer.uid):
        return
    if carried:  # an agent's reason is never an operator's (issue 27)
        raise AirlockError(
            ErrorCode.REASON_REQUIRED,
            "approving privileged work needs an operator's --reason (approval.operator_reason): "
            "submit the signature on operator.sock with airlock approve --signature --reason",
            {"field": "reason"},
        )
    problem = quorum.reason_problem(reason, settings.min_reason_length)
    if problem is not None:
        raise AirlockError(
            ErrorCode.REASON_REQUIRED, f"approving privileged work needs --reason: {problem}", {"field": "reason"}
        )
