"""`airlock can`: an agent's own `sudo -l -- CMD` -- what the policy would do with this request, and why.

intake asks (internal verb ``explain``) for the peer that asked it, with the
request the agent would send.  The answer is what decides *this* request and
nothing more: each stage's decision, the rules that decide it (their names
and descriptions), the binary it would run, whether an operator (and how
many) would be asked, and whether airlock is on hold.  Never the other rules
that matched, nor anyone else's.  Nothing is journaled and nothing runs:
asking is not doing.
"""

from __future__ import annotations

from typing import Protocol

from airlock.approval import verdict as ruling
from airlock.approval.asked import subject_of, user_name
from airlock.approval.rules import DEFAULT_RULE, UNRESOLVED_RULE, Policy
from airlock.approval.tickets import TicketBook
from airlock.common import validate
from airlock.common.peer import Peer
from airlock.common.resolve import default_path
from airlock.common.server import Call
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire


class Deciding(Protocol):
    """What explaining needs of the approval service (its policy, its hold, who intake is)."""

    policy: Policy
    book: TicketBook
    intake_uid: int | None


async def explain(approval: Deciding, call: Call, args: wire.Explain) -> wire.Explained:
    """The policy's answer for the peer's own request (`wire.approval.EXPLAIN`: intake's only)."""
    spec = ExecSpec.from_dict(args.spec)  # approval's own check of intake's spec
    try:
        peer = Peer.from_dict(args.peer.to_dict())
    except ValueError as exc:
        raise validate.bad("peer", str(exc)) from None
    if peer.uid != spec.uid:
        raise validate.bad("peer", "does not match the spec's uid")
    request = {"session": args.request.session}
    session = validate.optional_text("session", request.get("session"), max_len=256)
    decision = approval.policy.decide(subject_of(peer, spec, session), spec.stages)
    by_name = {rule.name: rule for rule in approval.policy.rules}
    stages = []
    for stage in decision.stages:
        deciding = [by_name[name] for name in (stage.deciding or (stage.rule,)) if name in by_name]
        stages.append(
            wire.StageAnswer(
                argv=tuple(stage.argv),
                binary=stage.resolved,
                decision=stage.decision,
                rules=tuple(wire.RuleNote(r.name, r.description or None) for r in deciding),
                default=stage.rule == DEFAULT_RULE,
                not_found=stage.rule == UNRESOLVED_RULE,
            )
        )
    requirement = approval.policy.requirement(decision)
    held = (await approval.book.current()).held  # after the start's restore, as decide reads it
    verdict = ruling.verdict(decision, held, None, requirement).decided.value
    return wire.Explained(
        decision=verdict,
        rule=decision.rule,
        stages=tuple(stages),
        run_as="root" if spec.run_as == 0 else (user_name(spec.run_as) if spec.user is not None else peer.user),
        searched=default_path(spec.run_as),
        approvals_needed=requirement.approvals if verdict == "ask" else 0,
        held=held,
        policy_note=approval.policy.standing.sentence(),
    )
