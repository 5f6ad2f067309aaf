"""airlock-approval: policy decisions, pending approvals, single-use tickets.

Two doors: ``internal/approval.sock`` (intake asks ``decide``; the runner
``redeem``s tickets) and ``operator.sock`` (the operators' own front door).
A decision is journaled before it is returned; an approval produces a ticket
bound to the spec's digest, valid once and for a few seconds.

`Approval` builds its parts once and hands each what it uses, explicitly
(no mixins): state with one owner is an object -- the ticket book with the
hold (`tickets.TicketBook`), the pending table (`table.PendingTable`), the
live grants (`granting.GrantBook`), the reviewer's denial memory
(`reviewing.Reviewing`), the session tokens (`sessions.SessionTokens`), the
passkeys (`passkeys.Passkeys`); the verbs are intake's (`decide.Deciding`),
the operators' (`operator.Operating`) and the votes' (`votes.Votes`).  What
a reload replaces (the settings, the policy, the notify hook) is read
through a getter, so every part sees the new one.  Here: the parts, reload
and stop, and `build` (the two doors).
"""

from __future__ import annotations

import dataclasses
import functools
import resource
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airlock.approval import explain, hook, standing
from airlock.approval.asks import AskLimits
from airlock.approval.decide import Deciding
from airlock.approval.granting import GrantBook
from airlock.approval.operator import Operating
from airlock.approval.parts import Books, Outside
from airlock.approval.passkeys import Passkeys
from airlock.approval.policy import PolicyError, load_policy_texts, policy_from_texts
from airlock.approval.reviewing import Reviewing
from airlock.approval.rules import Policy
from airlock.approval.sessions import SessionTokens
from airlock.approval.signed import Ledger
from airlock.approval.signers import Signers
from airlock.approval.standing import PolicyMode
from airlock.approval.table import PendingTable
from airlock.approval.tickets import TicketBook
from airlock.approval.tokens import TokenStore
from airlock.approval.votes import Votes
from airlock.common import daemon, lastgood, log
from airlock.common.audit import Audit, lifecycle
from airlock.common.config import Config, ConfigError, load
from airlock.common.errors import AirlockError, ErrorCode, within_reference_004
from airlock.common.ipc import Client
from airlock.common.peer import AllowList, Peer, may_decide, uid_of
from airlock.common.server import Door, Service
from airlock.common.wire import approval as wire_approval
from airlock.common.wire import verb as wire

NAME = "approval"


class Approval:
    """approval's parts, built once, and what a reload replaces."""

    def __init__(self, config: Config, policy: Policy, config_path: str | None, audit: Audit | None = None) -> None:
        self.config = config
        if policy.standing.mode is PolicyMode.CURRENT and policy.standing.accepted_at is None:
            policy = dataclasses.replace(policy, standing=standing.Standing(accepted_at=time.time()))
        self.policy = policy
        self.config_path = config_path
        self.audit = audit or Audit(config, "approval")  # a test may hand in its own journal
        self.journal = wire.Stub(
            wire.DoorName.JOURNAL,
            Client(config.socket_path("journal"), service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE),
        )
        self.runner = Client(
            config.socket_path("runner"), service="airlock-runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE
        )
        self.pending = PendingTable()  # by (agent uid, request ID)
        self.asks = AskLimits()
        self.tokens = TokenStore()
        self.sessions = SessionTokens(self.tokens, self.audit)
        self.notifier = hook.NotifyCommand(
            config.approval.notify_command, config.approval.notify_timeout_seconds, str(config.socket_path("operator"))
        )
        self.runner = Client(
            config.socket_path("runner"), service="airlock-runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE
        )
        self.intake_uid = uid_of(config.services.intake_user)
        self.log = log.get()
        self.book = TicketBook(
            self.journal,
            self.audit,
            self.log,
            self.pending,
            lambda: self.policy,
            lambda: self.config.approval.ticket_ttl_seconds,
        )
        self.reviewing = Reviewing(
            lambda: self.config, lambda: self.policy, self.book, self.runner, self.journal, self.log
        )
        self.ledger = Ledger(Signers(config.approval.allowed_signers))
        self.grants = GrantBook(self.audit, self.log)
        self.host = config.notify.host or socket.gethostname()
        # Issue 33 (approval/passkeys.py): enrollment links, sign-in challenges, assertions used, counters.
        self.passkeys = Passkeys(
            lambda: self.config, self.audit, self.runner, self.log, self.host, self.pending, self.grants
        )
        outside = Outside(self.audit, self.journal, self.runner, self.log, self.host)
        books = Books(self.book, self.grants, self.ledger, self.asks, self.sessions)
        self.votes = Votes(self, outside, self.pending, books)
        self.operating = Operating(self, outside, self.pending, books, self.votes, self.passkeys)
        self.deciding = Deciding(self, outside, self.pending, books, self.votes, self.reviewing)

    # --- lifecycle ---------------------------------------------------------------

    def interrupt_pending(self) -> None:
        self.pending.interrupt_all()

    async def reload(self) -> None:
        """``systemctl reload``: the policy and every ``approval.*`` setting, live.

        A request already pending keeps the deadline it was given (its agent
        was told it); new requests get the new settings.  Everything else in
        the file needs a restart (docs/configuration.md's "applies" column).
        """
        try:
            config = load(_path(self.config_path))
            policy = accept_policy(config, self.log)
        except (ConfigError, PolicyError) as exc:
            errors = exc.errors if isinstance(exc, PolicyError) else [str(exc)]
            # The policy in force stays; it was accepted, by this process or from the kept copy.
            kept = self.policy.standing.accepted_at if self.policy.standing.mode is not PolicyMode.CLOSED else None
            self.policy = dataclasses.replace(
                self.policy, standing=standing.refused(errors, kept_at=kept, now=time.time())
            )
            await self.record_refusal()
            return
        self.policy = policy
        self.log_policy_warnings()
        # Field by field with each value's own equality (asdict would compare signer_accounts' yaml nodes).
        old, new = self.config.approval, config.approval
        changed = sorted(f.name for f in dataclasses.fields(new) if getattr(old, f.name) != getattr(new, f.name))
        if changed:
            self.apply_approval_settings(dataclasses.replace(self.config, approval=config.approval))
        await self.audit.record(
            "policy.reloaded",
            payload={
                "default": policy.default,
                "rules": len(policy.rules),
                "sources": list(policy.sources),
                "settings_changed": [f"approval.{k}" for k in changed],
            },
        )

    async def record_refusal(self) -> None:
        """The refusal in journald and in the audit chain (`policy.rejected`), with every error."""
        said = self.policy.standing
        self.log.error("approval.policy.rejected", error="; ".join(said.refused), standing=str(said.mode))
        try:
            await self.audit.record("policy.rejected", payload=said.to_dict())
        except AirlockError as exc:  # the journal is down: journald has it; requests fail closed anyway
            self.log.error("approval.policy.rejected.unrecorded", error=exc.message)

    def log_policy_warnings(self) -> None:
        """What the policy loaded with but will not do as written (a missing user, group or binary)."""
        for warning in self.policy.warnings:
            self.log.warning("approval.policy.warning", warning=warning)

    def apply_approval_settings(self, config: Config) -> None:
        """Take the ``approval.*`` settings of ``config``, rebuilding what is made from them."""
        self.config = config
        self.notifier = hook.NotifyCommand(
            config.approval.notify_command, config.approval.notify_timeout_seconds, str(config.socket_path("operator"))
        )
        # The ledger keeps its memory (published statements, used signatures): only the keys change.
        self.ledger.signers = Signers(config.approval.allowed_signers)
        self.votes.warn_unmapped()  # allowed_signers or signer_accounts may have changed


LAST_GOOD = "policy.last-good.json"


def accept_policy(config: Config, logger: Any) -> Policy:
    """The policy on disk, accepted: kept as approval's last good copy; PolicyError if refused."""
    policy, texts = load_policy_texts(config)
    try:
        lastgood.save(config.approval.state_dir, LAST_GOOD, texts)
    except OSError as exc:  # still accepted; only a later refusal would miss the copy
        logger.warning("approval.policy.unkept", state_dir=str(config.approval.state_dir), error=str(exc))
    return dataclasses.replace(policy, standing=standing.Standing(accepted_at=time.time()))


def policy_at_start(config: Config, logger: Any) -> Policy:
    """Start on any policy files: the ones on disk; refused, the kept copy; none kept, closed (issue 44).

    A service that exits on a typo fails its sockets after the start limit and every agent and
    operator loses the gateway; this one stays up and says on every surface what decides.
    """
    if config.refused:  # airlock.yaml itself was refused: its policy: node is not the operator's
        errors: Sequence[str] = [config.refused]
    else:
        try:
            return accept_policy(config, logger)
        except PolicyError as exc:
            errors = exc.errors
    kept = lastgood.read(config.approval.state_dir, LAST_GOOD)
    if kept is not None:
        try:
            policy = policy_from_texts(kept[1])
            return dataclasses.replace(policy, standing=standing.refused(errors, kept_at=kept[0], now=time.time()))
        except PolicyError as again:  # a copy from another version that no longer parses
            logger.error("approval.policy.kept_refused", error="; ".join(again.errors))
    closed = Policy("ask", (), (), ())
    return dataclasses.replace(closed, standing=standing.refused(errors, kept_at=None, now=time.time()))


def _path(value: str | None) -> Any:
    from pathlib import Path

    return Path(value) if value and value != "<built-in>" else None


def internal_caller(intake_uid: int | None, runner_uid: int | None) -> wire.CallerOf:
    """Who a peer of approval's internal door is, by its uid: intake, the runner (both, if one account)."""

    def caller_of(peer: Peer) -> frozenset[wire.Caller]:
        roles = set()
        if intake_uid is not None and peer.uid == intake_uid:
            roles.add(wire.Caller.INTAKE)
        if runner_uid is not None and peer.uid == runner_uid:
            roles.add(wire.Caller.RUNNER)
        return frozenset(roles)

    return caller_of


def fd_budget(config: Config) -> int:
    """File descriptors approval may need at once with these caps (units/airlock-approval.service's
    LimitNOFILE= must be at least this; a lower limit is logged at start).

    operator.sock's connections; intake's (each agent connection may have a
    decide and a token check open here, the runner its redeem); one accept
    batch of refused connections (asyncio accepts up to 100 per turn) and a
    reserve for the journal client, the notify hook's pipes, logging and
    the name service's files.
    """
    return config.operators.max_connections + 3 * config.limits.max_connections + 100 + 92


def _check_fd_limit(config: Config) -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = fd_budget(config)
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.get().warning("approval.fd_limit.low", limit=soft, needed=needed)


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    policy = policy_at_start(config, log.get())
    approval = Approval(config, policy, config.source)
    approval.log_policy_warnings()
    if policy.standing.refused:
        await approval.record_refusal()
    _check_fd_limit(config)
    s = config.services
    internal = Door(
        "approval",
        allow=AllowList.of([s.intake_user, s.runner_user], []),
        verbs=wire.serve(
            wire_approval.DOOR,
            {
                wire_approval.DECIDE: approval.deciding.decide,
                wire_approval.EXPLAIN: functools.partial(explain.explain, approval),
                wire_approval.REDEEM: approval.book.redeem,
                wire_approval.TOKEN_CHECK: approval.sessions.check,
                wire_approval.WITHDRAW: approval.deciding.withdraw,
                wire_approval.APPROVE_SIGNED: approval.votes.approve_signed,
            },
            caller_of=internal_caller(approval.intake_uid, uid_of(s.runner_user)),
        ),
        # The spec travels once in ``decide`` (wire.approval): an agent's largest request, plus the envelope.
        max_line=config.limits.max_request_bytes + wire_approval.ENVELOPE_BYTES,
    )
    observers = config.operators.observers

    def decides(peer: Peer) -> bool:
        # airlock-web's user is an observer whatever its groups: it carries passkey verbs, decides nothing.
        if peer.user == config.web.user and peer.uid != 0:
            return False
        return may_decide(peer, config.operators.users, config.operators.groups, observers.users)

    operator = Door(
        "operator",
        allow=AllowList.of(
            [*config.operators.users, *observers.users, *([config.web.user] if config.web.url else [])],
            [*config.operators.groups, *observers.groups],
            root=True,
        ),
        errors=within_reference_004,
        verbs=approval.operating.operator_verbs(decides),
        # Issue 28: one observer's flood of connections cannot use up approval's
        # file descriptors (LimitNOFILE in the unit fits these caps; fd_budget).
        max_connections=config.operators.max_connections,
        max_per_peer=config.operators.connections_per_user,
    )
    service = Service(NAME, config, [internal, operator])
    service.on_reload = approval.reload
    service.on_stopping = approval.interrupt_pending
    lifecycle(service, approval.audit)
    journal_started = service.on_started
    journal_stopping = service.on_stop

    async def started() -> None:
        approval.votes.warn_unmapped()
        await approval.votes.restore_grants()  # before the hold: decide waits for the hold, so for the grants too
        await approval.reviewing.restore_denials()  # issue 45: until read, no grant and no reviewer allows
        await approval.book.restore_hold()
        if journal_started is not None:
            await journal_started()

    service.on_started = started

    async def stop() -> None:
        await approval.notifier.close()
        if journal_stopping is not None:
            await journal_stopping()

    service.on_stop = stop
    # An idle exit would revoke every session token (they live only in memory).
    service.keep_alive = lambda: (
        approval.tokens.live(time.time()) > 0
        or bool(approval.grants.live(time.time()))
        or bool(approval.passkeys.enrollments)
    )
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)
