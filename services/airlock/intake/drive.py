"""One request's drive through the other services: journal -> approval -> runner -> journal.

`Drive` holds intake's clients of the three internal doors and the state of
the requests on their way: the operations running now (for an agent's
``cancel``) and those waiting for their decision (withdrawn by a ``cancel``
or a closed connection).  The agent door (`airlock.intake.service`) runs
every gate it can alone, then hands each request here: the replay claim and
``op.begin``, approval's ``decide`` (waited for as long as approval says),
the runner's ``exec`` or ``files``, and the settled outcome kept for replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from airlock.common import log, validate
from airlock.common.audit import Audit, Ids
from airlock.common.codec import Event, Request, canonical_json
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client, Unreachable
from airlock.common.peer import Peer, uid_of
from airlock.common.server import Call, Connection
from airlock.common.spec import check_privilege
from airlock.common.wire import approval as wire_approval
from airlock.common.wire import journal as jwire
from airlock.common.wire import runner as runner_wire
from airlock.common.wire.verb import Stub
from airlock.intake.joining import Joins
from airlock.intake.request import ExecRequest
from airlock.intake.work import Work, exec_work

# A decision not back within this long is watched for the agent's withdrawal
# (a closed connection, a cancel); quicker ones are checked once, after it.
WATCH_AFTER_SECONDS = 0.05
# How long approval has to answer `decide` or say the request is pending; then
# (pending) its own deadline plus this margin.
DECIDE_MARGIN_SECONDS = 30.0
# The ipc client's per-call deadline, set out of the way where a window of its own bounds the call.
NO_CALL_DEADLINE = 400 * 24 * 3600.0
# Outcomes larger than this are kept for replay without their output bytes.
REPLAY_OUTPUT_LIMIT = 512 * 1024


def _replayed(request_id: str) -> AirlockError:
    return AirlockError(
        ErrorCode.REPLAYED_REQUEST,
        f"id: duplicate request id: {request_id!r} was already received within the replay window",
        {"field": "id"},
    )


@dataclass
class _Deciding:
    """A request waiting for approval's decision: whose it is, and how it is withdrawn."""

    uid: int
    withdraw: asyncio.Event = field(default_factory=asyncio.Event)
    settled: asyncio.Event = field(default_factory=asyncio.Event)


def _withdrawn(message: str) -> AirlockError:
    return AirlockError(ErrorCode.WITHDRAWN, message)


class Drive:
    """Intake's side of the hallways: its clients of journal, approval and runner, and the requests on their way."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.audit = Audit(config, "intake")
        self.journal = self.audit.journal
        self.approval = Client(
            config.socket_path("approval"),
            service="airlock-approval",
            unavailable=ErrorCode.APPROVAL_UNAVAILABLE,
            timeout=None,
        )
        self.runner = Client(
            config.socket_path("runner"),
            service="airlock-runner",
            unavailable=ErrorCode.RUNNER_UNAVAILABLE,
            timeout=None,
        )
        self.operations: dict[tuple[int, str], int] = {}  # (uid, running operation) -> the uid that started it
        # Operations waiting for their decision, by (uid, operation) -> the uid that asked, set to withdraw it.
        self.deciding: dict[tuple[int, str], _Deciding] = {}
        self.joins = Joins()  # issue 48: an agent's sudo retried after its tool gave up joins the first
        self.runner_uid = uid_of(config.services.runner_user)
        self.log = log.get()

    def _claim_args(self, request_id: str, peer: Peer) -> jwire.Claim:
        # The journal holds the claims, durably: a restart of intake (idle exit,
        # crash) must not reopen the replay window.  Unreachable journal ->
        # audit_unavailable from the client, so the gate fails closed.
        return jwire.Claim(f"{peer.uid}:{request_id}", self.config.limits.replay_window_seconds)

    async def claim(self, request_id: str, peer: Peer) -> None:
        claim = await self.journal.call(jwire.REQUEST_CLAIM, self._claim_args(request_id, peer))
        if not claim.claimed:
            raise _replayed(request_id)

    async def check_token(self, request: Request, peer: Peer) -> str | None:
        """The session of a valid token of this peer's (approval holds the tokens), or None without one.

        A missing required token and a wrong, expired, revoked or another
        agent's token all get the same refusal as any other, so a probe learns
        nothing.
        """
        if request.token is None:
            if self.config.agents.require_token:
                raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
            return None
        try:
            check = wire_approval.TokenCheck(request.token, peer.uid)
            data = (
                await Stub(wire_approval.DOOR, self.approval).call(wire_approval.TOKEN_CHECK, check, timeout=10)
            ).to_dict()
        except AirlockError as exc:
            # Approval could not answer (or could not tell who asked): that is not a bad token.
            if exc.code in (ErrorCode.APPROVAL_UNAVAILABLE, ErrorCode.IDENTITY_UNAVAILABLE):
                raise
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized") from None
        session = data.get("session")
        if not isinstance(session, str) or not session:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        return session

    # --- the life of a request: journal -> approval -> runner -> journal -----------------

    async def run(
        self, req: ExecRequest, peer: Peer, call: Call | None, *, conn: Connection | None = None
    ) -> dict[str, Any]:
        """An exec request."""
        return await self.run_work(exec_work(req, peer, self.config), peer, call, conn=conn)

    async def run_work(
        self, work: Work, peer: Peer, call: Call | None, *, conn: Connection | None = None
    ) -> dict[str, Any]:
        """Drive one request through the other services; the one path for exec and file work.

        ``conn`` is the agent's connection: the request belongs to it until it
        has its decision (closing it withdraws the request; see `_unless_withdrawn`),
        unless it said ``join``: then a retry joins it (`joining.Joins`).
        """
        if work.join:
            emit = call.emit if call is not None else None
            return await self.joins.drive(
                (peer.uid, work.operation_id), lambda: self._drive(work, peer, call, conn), emit, conn
            )
        return await self._drive(work, peer, call, conn)

    async def _drive(self, work: Work, peer: Peer, call: Call | None, conn: Connection | None) -> dict[str, Any]:
        # Refuse at once what a runner without root could never run (`airlock dev up`).
        check_privilege(work.run_as, self.runner_uid, privileged=work.privileged)
        op, digest = work.operation_id, work.digest
        key = operation_key(peer.uid, op)  # the journal's: each agent's IDs are its own
        ids = Ids(work.request_id, op, peer.uid, work.session or None)
        emit = call.emit if call is not None else None
        # One journal round trip: claim the request ID (the replay gate, last of
        # the gates), journal request.received, begin the operation.  The record
        # is deferred (issue 21): durable with the runner's exec.started, which
        # names its mark; the replay gate is decided at once all the same.
        received_event = self.audit.event(
            "request.received", ids, {"request": work.describe, "peer": peer.to_dict(), "digest": digest}
        )
        began = await self.journal.call(
            jwire.OP_BEGIN,
            jwire.OpBegin(
                key,
                digest,
                work.has_protected,
                self._claim_args(work.request_id, peer),
                dataclasses.replace(received_event, durable=False),
            ),
        )
        if not began.claimed:
            raise _replayed(work.request_id)
        received = began.event.mark if began.event is not None else None
        marks: list[str] = [received] if isinstance(received, str) else []
        self.audit.logged(
            "request.received", ids, None, {"durable": False}, {"request": work.describe, "digest": digest}
        )
        if began.state == jwire.OpState.REPLAY:
            await self.audit.record("operation.replayed", ids, payload={"digest": digest}, after=marks)
            return dict(began.outcome or {}) | {"replay": True}
        # From here until its outcome is known the operation is in progress in the
        # journal's replay table: every way out closes it exactly once, with
        # op.complete after the try (the work ran) or op.abandon in an except.
        try:
            self.joins.note((peer.uid, op), "accepted", {"operation_id": op, "request_id": work.request_id})
            if emit is not None:
                await emit("accepted", {"operation_id": op, "request_id": work.request_id})

            pending = False

            async def forward(event: Event) -> None:
                nonlocal pending
                pending = pending or event.event == "pending_approval"
                self.joins.note((peer.uid, op), event.event, event.fields)
                if emit is not None:
                    await emit(event.event, event.fields)

            try:
                decision = await self._unless_withdrawn(
                    self._decide(
                        work.decide_request | {"peer": peer.to_dict(), "operation_id": op, "after": marks},
                        forward,
                    ),
                    conn,
                    op,
                    work.request_id,
                    peer,
                    join=work.join,
                )
            except AirlockError as exc:
                if pending and exc.code is ErrorCode.APPROVAL_UNAVAILABLE:
                    # Approval went away while the request waited: never silently dropped.
                    raise AirlockError(
                        ErrorCode.APPROVAL_INTERRUPTED, "the approval service stopped while the request was pending"
                    ) from None
                raise
            if conn is not None and conn.peer_gone() and not work.join:
                # Approved as the agent left: nobody is there for it, so it never runs.
                raise _withdrawn("the requesting agent went away before the request ran")
            if emit is not None:
                await emit("approved", {"rule": decision.get("rule"), "decided_by": decision.get("decided_by")})
            if isinstance(decision.get("mark"), str):
                marks.append(decision["mark"])  # a rule's approval.decided, deferred too
            else:
                # approval journaled the decision (or approval.pending) durably, naming our marks:
                # they are durable now.  Dropping them lets a request that waited for an operator
                # run after the journal restarted (an idle exit) in the meantime.
                marks = []
            self.operations[(peer.uid, op)] = peer.uid
            try:
                args = runner_wire.approved(
                    work.runner_args,
                    ticket=decision["ticket"],
                    bound=decision.get("bound") or {},
                    operation_id=op,
                    after=marks,
                )
                reply = await runner_wire.stub(self.runner).call(
                    work.runner_verb, args, on_event=forward, timeout=work.runner_timeout
                )
                outcome = runner_wire.outcome(reply)
            except Unreachable as exc:
                if not exc.details.get("reply_too_large"):
                    raise
                # The work ran and its reply outgrew what we read: settle it without its output, so a
                # retry replays this instead of running the work again (the runner's own cap makes this rare).
                self.log.error("intake.reply.too_large", request_id=work.request_id, operation_id=op)
                outcome = {"operation_id": op, "stages": [], "stdout": "", "stdout_truncated": True}
                outcome |= {"output_retained": False, "reply_too_large": True}
            finally:
                self.operations.pop((peer.uid, op), None)
            # The runner's exec.finished, deferred: request.replied commits only with it.
            finished = outcome.pop("audit_mark", None)
            outcome = outcome | {
                "replay": False,
                "decision": {"rule": decision.get("rule"), "decided_by": decision.get("decided_by")},
            }
        except AirlockError as exc:
            await self._abandon(key, ids, exc, marks)
            raise
        except BaseException:  # cancelled, or a bug: the operation must not stay "in progress"
            await self._abandon(key, ids, None, marks)
            raise
        await self._settle(key, digest, outcome, work.thin, ids, [finished] if isinstance(finished, str) else [])
        if emit is not None:
            await emit("finished", {"exit_codes": [s.get("exit_code") for s in outcome.get("stages", [])]})
        return outcome

    async def _decide(self, args: dict[str, Any], forward: Callable[[Event], Awaitable[None]]) -> dict[str, Any]:
        """approval's ``decide``, waited for as long as approval says, and no longer.

        Intake keeps no copy of approval's settings (issue 32): approval
        answers at once or says the request is pending with its own deadline
        (``timeout_seconds`` of the ``pending_approval`` event, which a
        ``systemctl reload`` of approval changes for new requests); the wait
        is that deadline plus a margin for the answer to arrive.  An approval
        that neither answers nor says "pending" within the margin is
        unavailable (fail closed).
        """
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(DECIDE_MARGIN_SECONDS) as window:

                async def on_event(event: Event) -> None:
                    wait = event.fields.get("timeout_seconds")
                    if event.event == "pending_approval" and isinstance(wait, int | float) and wait >= 0:
                        window.reschedule(loop.time() + float(wait) + DECIDE_MARGIN_SECONDS)
                    await forward(event)

                # The client's own deadline stays out of the way: the window above is the bound.
                decided = await Stub(wire_approval.DOOR, self.approval).call(
                    wire_approval.DECIDE,
                    wire_approval.Decide.from_dict(args),
                    on_event=on_event,
                    timeout=NO_CALL_DEADLINE,
                )
                return decided.to_dict()
        except TimeoutError:
            raise AirlockError(
                ErrorCode.APPROVAL_UNAVAILABLE, "approval did not decide within the deadline it gave"
            ) from None

    async def _unless_withdrawn(
        self,
        deciding: Awaitable[dict[str, Any]],
        conn: Connection | None,
        op: str,
        request_id: str,
        peer: Peer,
        *,
        join: bool = False,
    ) -> dict[str, Any]:
        """Await approval's decision unless the agent withdraws first.

        The agent withdraws by closing its connection or by a ``cancel`` of the
        operation.  Intake then tells approval (``withdraw``), which takes the
        request out of ``pending`` at once and answers the ``decide`` call with
        ``withdrawn`` (journaled as ``approval.decided``, decision
        ``withdrawn``), so a later approve finds nothing to approve.  If
        approval cannot be told, the ``decide`` call is cancelled: closing its
        connection withdraws the request on approval's side too.  Whatever
        approval answered, a withdrawn request never goes to the runner.  A
        ``join`` request's agent may leave: it is withdrawn only when nobody
        has come back for it within ``agents.retry_window_seconds``.
        """
        decide = asyncio.ensure_future(deciding)
        if (peer.uid, op) in self.deciding:  # op.begin lets one request per operation in; keep the guard anyway
            decide.cancel()
            raise AirlockError(ErrorCode.OPERATION_IN_PROGRESS, f"operation {op!r} is in progress")
        state = _Deciding(peer.uid)
        self.deciding[(peer.uid, op)] = state
        watchers: list[asyncio.Future[Any]] = []
        try:
            # Most decisions are a policy rule's, at once: watch the agent only for those that wait.
            await asyncio.wait([decide], timeout=WATCH_AFTER_SECONDS)
            if not decide.done() and not state.withdraw.is_set():
                watchers.append(asyncio.ensure_future(state.withdraw.wait()))
                if conn is not None:
                    window_end = time.time() + self.config.agents.retry_window_seconds
                    gone = self.joins.abandoned((peer.uid, op), conn, window_end) if join else conn.wait_gone()
                    watchers.append(asyncio.ensure_future(gone))
                await asyncio.wait([decide, *watchers], return_when=asyncio.FIRST_COMPLETED)
            # A cancel that was answered "was: pending" wins even over a decision that came in the same moment.
            if not state.withdraw.is_set() and decide.done():
                return decide.result()
            by = "cancel" if state.withdraw.is_set() else "close"
            self.log.info("intake.request.withdrawn", request_id=request_id, operation_id=op, peer_uid=peer.uid, by=by)
            await self._withdraw(request_id, peer.uid, decide)
            if by == "cancel":
                raise _withdrawn("withdrawn by the agent's cancel before a decision")
            raise _withdrawn("the requesting agent went away before a decision")
        finally:
            self.deciding.pop((peer.uid, op), None)
            state.settled.set()
            for watcher in watchers:
                watcher.cancel()
            if not decide.done():
                decide.cancel()
            with contextlib.suppress(asyncio.CancelledError, AirlockError):
                await decide

    async def _withdraw(self, request_id: str, uid: int, decide: asyncio.Future[dict[str, Any]]) -> None:
        """Tell approval the request is withdrawn, and let it answer the decide call (both bounded).

        Approval keys pending requests by (uid, ID): the uid says whose request it is.
        """
        try:
            withdraw = wire_approval.Withdraw(request_id, uid)
            await Stub(wire_approval.DOOR, self.approval).call(wire_approval.WITHDRAW, withdraw, timeout=10)
            await asyncio.wait_for(asyncio.shield(decide), 10)
        except (AirlockError, TimeoutError):
            pass  # the finally cancels the decide call: approval sees its connection close

    async def _settle(
        self,
        op: str,
        digest: str,
        outcome: dict[str, Any],
        thin: Callable[[dict[str, Any]], dict[str, Any]],
        ids: Ids,
        after: list[str] | None = None,
    ) -> None:
        """Keep the settled outcome for replay and journal request.replied, in one round trip.

        The work already ran, so a failure here is logged, not returned.
        """
        stored = thin(outcome) if len(canonical_json(outcome)) > REPLAY_OUTPUT_LIMIT else outcome
        event = self.audit.event("request.replied", ids, {"status": "ok", "code": None, "message": None})
        if after:
            event = dataclasses.replace(event, after=tuple(after))
        try:
            done = await self.journal.call(jwire.OP_COMPLETE, jwire.OpComplete(op, digest, stored, event))
        except AirlockError as exc:
            self.log.error(
                "intake.outcome.unstored",
                request_id=ids.request_id,
                operation_id=ids.operation_id,
                code=exc.code.value,
                error=exc.message,
            )
            return
        seq = done.event.seq if done.event is not None else None
        self.audit.logged("request.replied", ids, seq, {"status": "ok"}, {"status": "ok"})

    async def _abandon(self, op: str, ids: Ids, exc: AirlockError | None, after: list[str] | None = None) -> None:
        """The operation did not settle: free its ID and journal the refusal, in one round trip."""
        event = None
        if exc is not None:
            event = self.audit.event(
                "request.replied", ids, {"status": "error", "code": exc.code.value, "message": exc.message}
            )
            if after:  # not journaled if the request's deferred records were lost
                event = dataclasses.replace(event, after=tuple(after))
        try:
            done = await self.journal.call(jwire.OP_ABANDON, jwire.OpAbandon(op, event))
        except AirlockError:
            return  # the reply goes out either way; the journal's outage is reported by the next append
        if exc is not None:
            self.audit.logged(
                "request.replied",
                ids,
                done.event.seq if done.event is not None else None,
                {"status": "error", "code": exc.code.value},
                {"status": "error", "code": exc.code.value},
            )

    async def cancel(self, request: Request, peer: Peer) -> dict[str, Any]:
        op = validate.text("operation_id", request.args.get("operation_id"), max_len=256, allow_empty=False)
        deciding = self.deciding.get((peer.uid, op))
        if deciding is not None and deciding.uid == peer.uid:
            deciding.withdraw.set()  # withdraws it: see _unless_withdrawn
            # Answer once approval has let go of it (bounded: _withdraw's own calls are).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(deciding.settled.wait(), 30)
            return {"operation_id": op, "cancelling": True, "was": "pending"}
        owner = self.operations.get((peer.uid, op))
        if owner is None or owner != peer.uid:
            raise AirlockError(ErrorCode.NOT_FOUND, f"no running operation {op!r} of yours")
        cancelled = await runner_wire.stub(self.runner).call(runner_wire.CANCEL, runner_wire.Cancel(op, peer.uid))
        return cancelled.to_dict()

    async def approve_signed(self, request: Request, peer: Peer) -> dict[str, Any]:
        """An agent carries an operator's signature (issue 18): approval checks it; the agent cannot forge one.

        The carrier (``peer``) goes with it: approval finds only the carrier's own
        request, and journals the carrier apart from the signer (issue 27).
        """
        unknown = sorted(set(request.args) - {"request_id", "signature", "reason"})
        signature = request.args.get("signature")
        if not isinstance(signature, str) or not signature or len(signature) > 16 * 1024:
            raise validate.bad("signature", "must be an armoured SSH signature (at most 16 KiB)")
        if unknown:
            raise validate.bad(unknown[0], "unknown argument (known: request_id, signature, reason)")
        args = {
            "request_id": validate.request_id("request_id", request.args.get("request_id")),
            # Armoured (several lines): approval reads it strictly (approval/statement.py).
            "signature": request.args.get("signature"),
            "reason": validate.text("reason", request.args.get("reason") or "", max_len=4096),
            "peer": peer.to_dict(),
        }
        signed = wire_approval.ApproveSigned.from_dict(args)
        return (
            await Stub(wire_approval.DOOR, self.approval).call(wire_approval.APPROVE_SIGNED, signed, timeout=60)
        ).to_dict()


def operation_key(uid: int, operation_id: str) -> str:
    """The journal's key for an agent's operation ID: the uid and a digest of the ID.

    Operation IDs belong to their agent: keyed by uid, another agent can
    neither claim one first (blocking it with operation_id_conflict) nor learn
    from a conflict that it was used.  Short and fixed-length, whatever the ID.
    """
    return f"u{uid}:" + hashlib.sha256(operation_id.encode("utf-8", "surrogatepass")).hexdigest()
