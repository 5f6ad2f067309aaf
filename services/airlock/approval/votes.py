"""Issue 18 in approval: quorum, reasons, signed approvals, and the grants' verbs.

`Votes` is an object handed what it shares with the rest of approval (the
settings, the journal, the ledger, the ticket book, the pending table, the
grants) and owning the refusals agents earned carrying signatures: the operator verbs
``statement``, ``grants`` and ``grant.revoke``, intake's ``approve_signed``,
and the steps ``decide`` and ``approve``/``deny`` take for quorum (`quorum`),
reasons, signatures (`signed`, `signers`, `statement`) and grants (`grants`).
Every vote and every grant is journaled as an ``operator.action`` (outside a
request's lifecycle: docs/architecture.md); a request's ``approval.decided``
names its approvers.
"""

from __future__ import annotations

import secrets
import shlex
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from airlock.approval import ballot, quorum, restore
from airlock.approval import statement as statements
from airlock.approval.grants import Grant
from airlock.approval.grants import restore as restore_grants
from airlock.approval.parts import Books, Live, Outside
from airlock.approval.pending import Pending, fleet_binding, ticket_binding
from airlock.approval.rules import Decision
from airlock.approval.signed import RefusalLimit
from airlock.approval.signers import Signer
from airlock.approval.statement import SIGN_COMMAND
from airlock.approval.table import PendingTable, check_expected
from airlock.common import shown, validate
from airlock.common.arguments import describe as describe_argument
from airlock.common.audit import Ids
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer, identify
from airlock.common.server import Call
from airlock.common.wire import approval as wire
from airlock.common.wire import operator as op
from airlock.common.wire.verb import Empty


@dataclass(frozen=True, slots=True)
class Signed:
    """A signature submitted to decide a pending request: by an operator (``id``, ``--expect``, maybe
    ``--principal``) on operator.sock, or carried by an agent (its own request ID) through intake."""

    ref: Any  # the request: checked where it is looked up
    signature: Any  # armoured: `Ledger.read` reads it strictly
    reason: Any = ""
    principal: str | None = None  # an operator's only: on the agent door it would tell which principals exist
    expect: str | None = None


# How long approval waits at start to read its grants from the journal (as for the hold).
RESTORE_SECONDS = 30.0


class Votes:
    """Signatures, statements, a required reason's deny, and the grants' verbs."""

    def __init__(self, live: Live, outside: Outside, pending: PendingTable, books: Books) -> None:
        self.live = live  # the configuration now (a reload replaces approval.*)
        self.audit, self.journal, self.log, self.host = outside.audit, outside.journal, outside.log, outside.host
        self.ledger = books.ledger  # published statements and used signatures (decide publishes, votes check)
        self.book, self.grants = books.tickets, books.grants
        self.pending = pending  # settles every pending request (table.py)
        self.refusals = RefusalLimit()  # refused signatures an agent carried, per uid

    @property
    def config(self) -> Config:
        return self.live.config

    def _schedule(self, grant: Grant, used: int = 0) -> None:
        self.grants.schedule(grant, used)

    async def list_grants(self, call: Call, args: Empty) -> op.Grants:
        await self.book.current()  # restored after the grants: the listing right after a restart is whole
        return op.Grants(tuple(self.grants.listing(time.time())))

    async def revoke_grant(self, call: Call, args: op.GrantRevoke) -> op.GrantRevoked:
        return op.GrantRevoked(await self.grants.revoke(args.grant_id, call.peer, args.reason or ""), True)

    async def restore_grants(self) -> None:
        """At start: the live grants are the journal's grants not revoked or expired (none if it cannot be read)."""
        try:
            live, _ended = restore_grants(await restore.grant_records(self.journal, RESTORE_SECONDS))
        except AirlockError as exc:
            self.log.error("approval.grants.unknown", error=exc.message, code=exc.code.value)
            return
        now = time.time()
        for grant, used in live:
            self._schedule(grant, used)  # an expired one ends (and is journaled) at once
        self.log.info("approval.grants.restored", live=sum(1 for g, _ in live if g.expires > now))

    def warn_unmapped(self) -> None:
        """At start: name the allowed_signers principals no account is mapped to (their votes count only
        where no quorum and no self-approval check applies; docs/policy.md)."""
        path = self.config.approval.allowed_signers
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return  # off, or unreadable: Signers.require says so at the first signature
        mapped = self.config.approval.signer_accounts
        unmapped = sorted({p for p in statements.allowed_principals(text) if mapped.account(p) is None})
        if unmapped:
            self.log.warning("approval.signers.unmapped", path=str(path), principals=unmapped[:32], count=len(unmapped))

    def pending_extra(self, entry: Pending) -> dict[str, Any]:
        """approval.pending's issue-18 fields: the quorum asked for, and (signing on) the statement to sign;
        and issue 27's ``expect``, which every approve line made from the event carries."""
        out: dict[str, Any] = {"expect": entry.expect}
        if entry.tally is not None and entry.tally.requirement != quorum.Requirement():
            out["requirement"] = entry.tally.requirement.to_dict()
        if entry.published is not None and self.ledger.signers.enabled():
            out["statement"] = entry.published.statements["allow"].render()
        if entry.bound.get("arguments"):  # issue 27: flagged for people (watch, relay, show)
            out["arguments"] = entry.bound["arguments"]
        if entry.opinion:  # issue 34: the reviewer's opinion, for watch, show and the relay
            out["reviewer"] = entry.opinion
        return out

    async def deny_for_reason(
        self, decision: Decision, problem: str, common: Ids, *, after: list[str] | None = None
    ) -> NoReturn:
        """A rule's ``reason: required`` not met (`verdict.verdict` said so): the request is denied, journaled,
        before an operator sees it."""
        await self.audit.record(
            "approval.decided",
            common,
            payload={
                "decision": "deny",
                "rule": decision.rule,
                "by": "policy",
                "code": ErrorCode.REASON_REQUIRED.value,
                "reason": problem,
                "policy": decision.to_dict(),
            },
            log_fields={"decision": "deny", "rule": decision.rule},
            after=after,
        )
        raise AirlockError(
            ErrorCode.REASON_REQUIRED, f"rule {decision.rule!r}: {problem}", {"rule": decision.rule, "field": "reason"}
        )

    def statements(self, entry: Pending) -> dict[str, statements.Statement]:
        raw_spec = entry.request.get("spec")
        spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
        command = " | ".join(shlex.join(str(a) for a in stage) for stage in spec.get("stages") or [])
        if not command:  # a file operation
            command = f"{entry.request.get('tool', '')} {entry.request.get('path', '')}".strip()
        nonce = secrets.token_hex(16)
        return {
            decision: statements.Statement(
                host=self.host,
                request=entry.request_id,
                binding=ticket_binding(entry.digest, entry.bound),
                fleet_binding=fleet_binding(entry.digest, entry.bound),
                decision=decision,
                expires=int(entry.expires),
                nonce=nonce,
                requester=f"{entry.peer.user} (uid {entry.peer.uid})",
                run_as=f"{entry.run_as_user} (uid {entry.run_as})",
                command=command,
                cwd=shown.cwd_line(spec.get("cwd"), privileged=entry.privileged) if spec else "",
                stdin=shown.stdin_line(spec.get("stdin")) if spec else "",
                reason=str(entry.request.get("reason") or ""),
                arguments="; ".join(describe_argument(a) for a in entry.bound.get("arguments") or []),
                credentials=describe_credentials(entry.bound.get("credentials")),
            )
            for decision in statements.DECISIONS
        }

    async def statement(self, call: Call, args: op.Statement) -> op.StatementText:
        """The exact text a signer signs to approve (or deny) a pending request."""
        entry = self.pending.find(args.id, args.expect)
        decision = args.decision
        # --sign: never sign another request's statement
        await check_expected(self.audit, call, entry, "statement", args.expect)
        assert entry.published is not None
        text = entry.published.statements[decision].render()
        return op.StatementText(
            entry.quorum_dict()
            | {
                "request_id": entry.request_id,
                "decision": decision,
                "statement": text,
                "expires": entry.published.statements[decision].expires,
                "namespace": statements.NAMESPACE,
                "sign_command": SIGN_COMMAND,
                "signatures": self.ledger.signers.enabled(),
            }
        )

    async def approve_signed(self, call: Call, args: wire.ApproveSigned) -> wire.SignedVote:
        """intake (`wire.approval.APPROVE_SIGNED`, intake's only): an agent carried a signature (agent verb
        approve_signed); the signature decides.

        intake names the carrier (``peer``): the request must be the carrier's
        own (keyed by (uid, ID): another agent's answers ``not_found``), and
        the carrier's refusals are rate-limited.
        """
        try:
            carrier = Peer.from_dict(args.peer.to_dict())
        except ValueError as exc:
            raise validate.bad("peer", str(exc)) from None
        signed = Signed(args.request_id, args.signature, args.reason)
        vote = await self.settle_signed(call, signed, statements.DECISIONS, via="agent", carrier=carrier)
        return wire.SignedVote.from_dict(vote)

    def _signed_voter(self, signer: Signer, carrier: Peer) -> quorum.Voter:
        """The person a signature is (``approval.signer_accounts``), carried by ``carrier``."""
        account = self.config.approval.signer_accounts.account(signer.principal)
        person = _account(account) if account is not None else None
        if person is None:  # unmapped (or its account is gone): it counts only where no check needs the person
            return quorum.Voter(
                None,
                signer.principal,
                principal=signer.principal,
                fingerprint=signer.fingerprint,
                carrier_uid=carrier.uid,
                carrier_user=carrier.user,
            )
        return quorum.Voter(
            person.uid,
            person.user,
            frozenset(person.groups),
            principal=signer.principal,
            fingerprint=signer.fingerprint,
            carrier_uid=carrier.uid,
            carrier_user=carrier.user,
        )

    async def settle_signed(
        self, call: Call, signed: Signed, decisions: tuple[str, ...], *, via: str, carrier: Peer
    ) -> dict[str, Any]:
        ref = validate.text("id", signed.ref, max_len=256, allow_empty=False)
        reason = validate.text("reason", signed.reason or "", max_len=4096)
        # Only an operator may name the principal: on the agent door it would tell which principals exist.
        principal = signed.principal if via == "operator" else None
        # An agent addresses its own requests only, and its refusals are bounded (each is journaled).
        owner = carrier.uid if via == "agent" else None
        if owner is not None:
            self.refusals.check(owner)
        entry: Pending | None = None
        try:
            # An operator names a request exactly (ID or AGENT/ID, and --expect); an agent only its own.
            entry = self.pending.find(ref, signed.expect) if owner is None else self.pending.own(owner, ref)
        except AirlockError as exc:
            if exc.code is not ErrorCode.NOT_FOUND:
                raise
        if entry is None and owner is not None and self.ledger.latest(ref, owner) is None:
            # Not the carrier's (or no such request): nothing is journaled, nothing is revealed.
            self.refusals.refused(owner)
            raise AirlockError(ErrorCode.NOT_FOUND, f"no pending request {ref!r} of yours")
        if entry is not None and via == "operator":
            await check_expected(
                self.audit, call, entry, "approve" if decisions == ("allow",) else "deny", signed.expect
            )
        request_id = entry.request_id if entry is not None else ref
        ids = Ids(request_id, entry.operation_id if entry else None, carrier.uid)
        signature = None
        approver_reason = ""
        try:
            signature = self.ledger.read(signed.signature)
            signer = await self.ledger.signer(signature, principal)
            if entry is None:
                gone = self.ledger.latest(ref, owner)
                if gone is None:
                    raise AirlockError(ErrorCode.NOT_FOUND, f"no pending request {ref!r}")
                await self.ledger.check(signature, signer, gone, decisions, time.time(), owner=owner)
                raise AirlockError(
                    ErrorCode.STATEMENT_EXPIRED if gone.state == "expired" else ErrorCode.SIGNATURE_REPLAYED,
                    f"request {ref!r} is no longer pending ({gone.state})",
                    {"fingerprint": signer.fingerprint, "principal": signer.principal},
                )
            assert entry.published is not None
            verdict = await self.ledger.check(signature, signer, entry.published, decisions, time.time(), owner=owner)
            if not self.pending.is_open(entry):
                raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
            voter = self._signed_voter(signer, carrier)
            # The reason is the approver's only when the person submits it on their own door;
            # an agent's (or another operator's) is the carrier's, journaled apart.
            if via == "operator" and voter.uid == carrier.uid:
                approver_reason = reason
            if verdict == "allow":
                # An operator who submits someone's signature vouches with their own reason (journaled
                # as the carrier's); an agent's reason never stands for an operator's.
                ballot.require_operator_reason(self.config.approval, entry, reason, carried=via == "agent")
                ballot.check_vote(self.config.approval, entry, voter)
        except AirlockError as exc:
            if owner is not None:
                self.refusals.refused(owner)
            if exc.code is not ErrorCode.NOT_FOUND:
                await self.audit.record(
                    "operator.action",
                    ids,
                    payload={
                        "action": "signature.refused",
                        "via": via,
                        "code": exc.code.value,
                        "message": exc.message,
                        "operator": carrier.user if via == "operator" else None,
                        "carrier": {"uid": carrier.uid, "user": carrier.user},
                        "carrier_reason": reason,
                        "fingerprint": signature.fingerprint if signature else None,
                        "principal": exc.details.get("principal"),
                        "agent_uid": entry.peer.uid if entry is not None else owner,
                    },
                )
            raise
        assert entry is not None
        self.ledger.used(signature)
        payload: dict[str, Any] = {
            "action": "approve" if verdict == "allow" else "deny",
            "via": via,
            "signed": True,
            "principal": signer.principal,
            "fingerprint": signer.fingerprint,
            "key_type": signer.key_type,
            "operator": voter.user if voter.uid is not None else None,  # the person who approved
            "operator_uid": voter.uid,
            "reason": approver_reason,
            "carrier": {"uid": carrier.uid, "user": carrier.user},
            "agent_uid": entry.peer.uid,  # whose request: request IDs are each agent's own
        }
        if reason and not approver_reason:
            payload["carrier_reason"] = reason
        await self.audit.record("operator.action", ids, payload=payload | ballot.progress(entry, verdict))
        out = ballot.count(self.config.approval, self.pending, entry, verdict, voter, approver_reason)
        return out | {"signer": voter.to_dict()}


def _account(account: str) -> Peer | None:
    """The operator account a principal maps to, as a peer (its uid and groups now); None if it is gone."""
    import pwd

    try:
        entry = pwd.getpwuid(int(account)) if account.isdigit() else pwd.getpwnam(account)
    except KeyError:
        return None
    return identify(0, entry.pw_uid, entry.pw_gid)


def describe_credentials(bound: Any) -> str:
    """A statement's credentials line: ``stage 1: db, api`` per stage that receives any (names only)."""
    if not isinstance(bound, list):
        return ""
    return "; ".join(
        f"stage {i}: {', '.join(sorted(stage))}"
        for i, stage in enumerate(bound, start=1)
        if isinstance(stage, dict) and stage
    )
