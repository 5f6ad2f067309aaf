"""airlock-runner: executes approved work, and nothing else.

Its verbs are declared in `common.wire.runner` and its door table is built
from them (`wire.verb.serve`): ``exec`` and ``files`` for intake only;
approval's ``inspect`` of a root job's path arguments at decide time, its
operators' ``cancel``, ``kill``, ``running``, ``output`` and
``files_preview``, and ``passkeys.write``.  The spec arrives typed, decoded
once with its message; what the runner must not take on trust it checks
again by name (runner/recheck.py), redeems the approval ticket (single use,
bound to the digest it computes itself) before anything runs, and makes
``exec.started`` durable in the journal before the first process is spawned.
No ticket, no journal: nothing runs.

Issue 35: every job's output is kept (keptoutput.py) and a rule's credentials
are checked and read before it starts (credentials.py).
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import Mapping

from airlock.common import containment as modes
from airlock.common import daemon, log
from airlock.common.audit import Audit, Ids, lifecycle
from airlock.common.codec import iso_utc
from airlock.common.config import Config
from airlock.common.containment import Containment
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.kinds import MAX_PAYLOAD_BYTES
from airlock.common.peer import AllowList, Peer, uid_of
from airlock.common.server import Call, Door, Service
from airlock.common.wire import runner as wire
from airlock.common.wire.verb import Caller, Empty, serve
from airlock.runner import arguments, credentials, forker, jobverbs, recheck, review, units
from airlock.runner.control import JobControl
from airlock.runner.endconfirm import EndRecords
from airlock.runner.endrecord import (
    KILLED_BYTES,
    MIN_TREE_BYTES,
    TREE_BYTES,
    audit_summary,
    end_record_fits,
    fit_reply,
    spec_record,
)
from airlock.runner.fileop_verbs import FileVerbs
from airlock.runner.identity import default_cwd, resolve_identity
from airlock.runner.keptoutput import KeptOutput
from airlock.runner.passkeys import PasskeyWriter
from airlock.runner.spawn import run_job
from airlock.runner.treeclient import TreeClient

NAME = "runner"


class Runner:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.audit = Audit(config, "runner")
        self.approval = Client(
            config.socket_path("approval"), service="airlock-approval", unavailable=ErrorCode.APPROVAL_UNAVAILABLE
        )
        self.running: dict[tuple[int, str], asyncio.Event] = {}  # (requesting uid, operation ID)
        self.intake_uid = uid_of(config.services.intake_user)
        self.approval_uid = uid_of(config.services.approval_user)
        self.log = log.get()
        # Deferred exec.finished records not yet confirmed durable (issue 21).
        self.end_records = EndRecords(self.audit, self.log)
        self.kept = KeptOutput(config, self.log, self.audit)  # issue 35: every job's output log
        # Exec trees (issue 35): airlock-exectree follows every job for the runner (runner/treeclient.py,
        # issue 47: the kernel's process events need rights the runner no longer holds); live control per job.
        self.trees = TreeClient(config.socket_path("exectree"))
        self.controls: dict[tuple[int, str], tuple[str | None, JobControl]] = {}  # key -> (request ID, control)

    def containment(self) -> Containment:
        return modes.resolve(self.config.runner.containment)

    def caller_of(self, peer: Peer) -> frozenset[Caller]:
        """Who a peer of this door is, for the declarations' callers (both, when intake and approval share a uid)."""
        roles = set()
        if self.intake_uid is not None and peer.uid == self.intake_uid:
            roles.add(Caller.INTAKE)
        if self.approval_uid is not None and peer.uid == self.approval_uid:
            roles.add(Caller.APPROVAL)
        if not roles:
            self.log.warning("runner.peer.refused", peer_uid=peer.uid, peer_pid=peer.pid)
        return frozenset(roles)

    async def _refuse(self, exc: AirlockError, ids: Ids, after: list[str] | None = None) -> AirlockError:
        try:
            await self.audit.record(
                "exec.refused", ids, payload={"code": exc.code.value, "message": exc.message}, after=after
            )
        except AirlockError:
            pass  # the refusal stands whether or not it could be journaled
        return exc

    async def exec(self, call: Call, args: wire.Exec) -> wire.Ran:
        spec = args.spec
        ids = Ids(args.request_id, args.operation_id, spec.uid, args.session)
        # Operation IDs belong to their agent (issue 14): another agent's running
        # operation of the same ID is neither blocked nor revealed.
        key = (spec.uid, args.operation_id)
        if key in self.running:
            raise await self._refuse(
                AirlockError(ErrorCode.OPERATION_IN_PROGRESS, "this operation is already running"), ids
            )
        # Registered before the first await, so that a cancel arriving while the
        # ticket is redeemed or the scope created is not lost: the job then never starts.
        cancel = asyncio.Event()
        self.running[key] = cancel
        control = JobControl(self.trees, self.config.runner.exec_tree_max, cancel)
        self.controls[key] = (args.request_id, control)
        try:
            return await self._exec(call, args, ids, cancel, control)
        finally:
            self.running.pop(key, None)
            self.controls.pop(key, None)

    async def _exec(
        self, call: Call, args: wire.Exec, ids: Ids, cancel: asyncio.Event, control: JobControl
    ) -> wire.Ran:
        spec = args.spec
        # The request's deferred records (request.received, approval.decided):
        # exec.started commits only together with them, or not at all.
        after = list(args.after)
        # Computed here, once, from the spec as received: the ticket is bound to it (redeem checks).
        digest = spec.digest()
        try:
            prepared = await recheck.prepare(self.config, self.approval, args, digest, self.containment())
            job = prepared.job
            # A rule's credentials (issue 35): checked and read now, values only ever redacted.
            loaded = credentials.load(args.bound, job)
            job = loaded.apply(job)
            control.protected = job.protected_values  # the exec tree's argv is redacted like the output
        except AirlockError as exc:
            # Every refusal before exec.started is journaled: nothing ran.
            raise await self._refuse(exc, ids, after) from None
        if prepared.decided is not None and prepared.decided not in after:
            after.append(prepared.decided)  # from approval itself, whatever intake passed on
        try:
            # The end record must fit, or the job never starts (issue 29): checked before
            # exec.started, so a request can never run without its exec.finished.
            # The exec tree takes what room is left (at most TREE_BYTES).
            fits = end_record_fits(job, self.config.journal.output_head_bytes)
            tree_room = min(TREE_BYTES, MAX_PAYLOAD_BYTES - fits - KILLED_BYTES)
        except AirlockError as exc:
            raise await self._refuse(exc, ids, after) from None
        # The output log's name is journaled with the start; the log itself exists once that is durable.
        log_name = self.kept.new_name(job)
        control.summary = {
            "stages": [list(argv) for argv in spec.stages],
            "agent_uid": spec.uid,
            "uid": job.identity.uid,
            "containment": job.containment,
            "started_at": iso_utc(time.time()),
        }
        # The spec by its digest only (issue 50): request.received holds it whole under the
        # same digest, so repeating it here doubled an exec's journal bytes.  journald's
        # sentence still spells the command (from the spec in hand, large argv by digest).
        started = (
            {
                "digest": digest,
                "uid": job.identity.uid,
                "gid": job.identity.gid,
                "cwd": job.cwd,
                "containment": job.containment.value,
                # Variables the runner added, by name only: the agent socket's path is a
                # value from the peer's own environment.
                "added_env": prepared.added,
                "binaries": [dict(b) for b in job.binaries or ()],
                "sandbox": [dict(sb.settings) for sb in job.sandboxes] if job.sandboxes else None,
            }
            | ({"arguments": [dict(a) for a in job.arguments]} if job.arguments else {})
            | ({"credentials": loaded.record()} if loaded.items else {})
            | ({"output_log": log_name} if log_name is not None else {})
        )
        await self.audit.record(
            "exec.started", ids, payload=started, after=after, said=started | {"spec": spec_record(spec.to_dict())}
        )
        output_log = self.kept.open(job, ids, log_name)

        # Output events go out in order through one queue, all before the final reply.
        chunks: asyncio.Queue[tuple[str, int, bytes] | None] = asyncio.Queue()

        async def forward() -> None:
            while (item := await chunks.get()) is not None:
                name, stage, chunk = item
                await call.emit(name, {"stream": name, "stage": stage, "data": base64.b64encode(chunk).decode()})

        forwarder = asyncio.create_task(forward()) if args.stream else None
        try:
            result = await run_job(
                job,
                on_output=(lambda n, i, c: chunks.put_nowait((n, i, c))) if args.stream else None,
                cancel=cancel,
                log=output_log,
                control=control,
            )
        except AirlockError as exc:
            # The binary vanished or became unexecutable since approval, or the scope
            # could not be created: after exec.started, the journal says why nothing followed.
            raise await self._refuse(exc, ids) from None
        finally:
            if forwarder is not None:
                chunks.put_nowait(None)
                await forwarder
            kept = await self.kept.close(output_log)
        evidence = result.to_evidence() | {
            "operation_id": args.operation_id,
            "cwd": job.cwd,
            "uid": job.identity.uid,
            "gid": job.identity.gid,
            "hostname": socket.gethostname(),
        }
        summary = audit_summary(evidence, self.config.journal.output_head_bytes, result)
        if kept is not None:
            summary["output_log"] = kept
        # What the job executed and who killed it go to the journal only: the agent's reply is as before.
        tree = await control.tree(tree_room) if tree_room >= MIN_TREE_BYTES else None
        if tree is not None:
            summary["tree"] = tree
        elif control.watch is not None:  # a record this full has no room for it (_MARGIN holds this line)
            summary["tree"] = {
                "source": self.trees.source,
                "complete": False,
                "unavailable": "no room left in exec.finished",
            }
        if control.killed is not None:
            killed = control.killed
            if tree_room < 0:  # no room kept for the reason either
                killed = {k: v for k, v in killed.items() if k != "reason"} | {"reason_omitted": True}
            summary["killed"] = killed
        evidence = fit_reply(evidence)
        mark: str | None = None
        try:
            if result.cancelled:
                await self.audit.record("exec.cancelled", ids, payload={"digest": digest, "started": result.started})
            # Deferred (issue 21): intake's request.replied names the mark and commits
            # only with it; `EndRecords` makes sure it lands even if the journal restarts.
            finished = self.audit.event("exec.finished", ids, summary)
            try:
                mark = await self.audit.defer(
                    "exec.finished",
                    ids,
                    payload=summary,
                    log_fields={"exit_code": summary["exit_codes"][-1], "timed_out": result.timed_out},
                )
            except AirlockError:
                await self.audit.ensure(finished)  # the journal may or may not have queued it
            else:
                self.end_records.add(mark, finished)
        except AirlockError as exc:
            # The work ran: its evidence goes back whatever the journal says.  An
            # error here would make intake abandon the operation, and a retry would
            # run the command a second time.
            self.log.error(
                "runner.audit.unrecorded", operation_id=args.operation_id, code=exc.code.value, error=exc.message
            )
        return wire.Ran(evidence, mark)

    async def inspect(self, call: Call, args: wire.Inspect) -> wire.Inspected:
        """approval, at decide time: a root job's path arguments that someone other than root can change.

        The runner answers because it is root (approval may not see the files)
        and because it is the one that must find the same files before the job
        starts (runner/arguments.py).
        """
        spec = args.spec
        if not spec.privileged:
            return wire.Inspected(())
        cwd = spec.cwd or default_cwd(resolve_identity(spec.run_as))
        found = await asyncio.to_thread(
            arguments.inspect,
            spec.stages,
            list(args.programs),
            cwd,
            cwd_given=spec.cwd is not None,
            root=arguments.view(self.containment()),
        )
        return wire.Inspected(tuple(found))

    async def review(self, call: Call, args: wire.Review) -> wire.Reviewed:
        """approval, for an ask: run the configured reviewer on the statement it sends (runner/review.py)."""
        statement = args.statement
        report = await review.review(self.config, statement, systemd=self.containment().systemd)
        self.log.info(
            "runner.review.finished",
            request_id=statement.get("request_id") if isinstance(statement.get("request_id"), str) else None,
            ran=report.get("ran"),
            exit_code=report.get("exit_code"),
            timed_out=report.get("timed_out"),
            why=report.get("why"),
        )
        return wire.Reviewed.from_dict(report)  # the reviewer's output as a reply: checked like one

    async def kill(self, call: Call, args: wire.Kill) -> wire.Killed:
        """approval, for an operator: signal a running job (runner/jobverbs.py)."""
        return await jobverbs.kill(self.controls, args, self.log)

    async def running_jobs(self, call: Call, args: Empty) -> wire.Running:
        """approval, for an operator's `running` (and `airlock watch`): the commands running now."""
        return jobverbs.running(self.controls)

    async def cancel(self, call: Call, args: wire.Cancel) -> wire.Cancelling:
        # intake names the agent whose operation it is; an operator (through approval) may cancel any.
        events = [e for (owner, op), e in self.running.items() if op == args.operation_id and args.uid in (None, owner)]
        if not events:
            raise AirlockError(ErrorCode.NOT_FOUND, f"operation {args.operation_id!r} is not running")
        for event in events:
            event.set()
        return wire.Cancelling(args.operation_id, True)

    def door(self, file_verbs: FileVerbs, passkeys: PasskeyWriter) -> Door:
        """runner.sock: exactly the verbs `common.wire.runner` declares, each for its declared callers."""
        return Door(
            "runner",
            # intake's uid (exec, files, cancel) and approval's (its operators' verbs); each verb
            # then refuses a caller its declaration does not name (`caller_of`).
            allow=AllowList.of([self.config.services.intake_user, self.config.services.approval_user], []),
            verbs=serve(
                wire.DOOR,
                {
                    wire.EXEC: self.exec,
                    wire.CANCEL: self.cancel,
                    wire.KILL: self.kill,
                    wire.RUNNING: self.running_jobs,
                    wire.INSPECT: self.inspect,
                    wire.REVIEW: self.review,
                    wire.OUTPUT: self.kept.output,
                    wire.FILES: file_verbs.files,
                    wire.FILES_PREVIEW: file_verbs.files_preview,
                    wire.PASSKEYS_WRITE: passkeys.write,
                },
                caller_of=self.caller_of,
            ),
            # The spec travels once: a request's limit, plus what approval bound (wire.runner.BOUND_ROOM).
            max_line=wire.max_line(self.config.limits.max_request_bytes),
        )


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    runner = Runner(config)
    if config.runner.exec_tree_max > 0:
        runner.trees.wake()  # airlock-exectree opens its kernel source while the runner starts
    if runner.containment() is Containment.SERVICE:
        units.warm()  # the bus connection the first job would otherwise open
        forker.warm()  # and the fork server that forks its stages into scopes (issue 50)
    service = Service(NAME, config, [runner.door(FileVerbs(runner), PasskeyWriter(config))])
    lifecycle(service, runner.audit)
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)


__all__ = ["NAME", "Runner", "build", "main"]
