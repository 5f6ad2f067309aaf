"""airlock-runner: executes approved work, and nothing else.

Its verbs are a small fixed table (``exec``, ``cancel``, the file verbs, and
approval's ``inspect`` of a root job's path arguments at decide time).  The socket admits
intake's uid and approval's (an operator's ``cancel`` arrives through
approval), and ``exec`` accepts only intake's.  Each re-checks its inputs even though intake validated them,
redeems the approval ticket (single use, bound to the spec's digest) before
anything runs, and makes ``exec.started`` durable in the journal before the
first process is spawned.  No ticket, no journal: nothing runs.

Issue 35: every job's output is kept (outputlog.py) and a rule's credentials
are checked and read before it starts (credentials.py); ``output`` (approval's
uid only) reads a kept log for an operator, or follows a running job's.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any, Literal

from airlock.common import binary, daemon, log, sandbox, validate
from airlock.common.arguments import parse_bound as argparse_bound
from airlock.common.audit import Audit, Ids, lifecycle, marks_of
from airlock.common.codec import canonical_json, iso_utc
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import MAX_REPLY_BYTES, Client
from airlock.common.kinds import MAX_PAYLOAD_BYTES
from airlock.common.peer import AllowList, uid_of
from airlock.common.server import Call, Door, Service
from airlock.common.spec import ExecSpec, check_privilege
from airlock.common.wire import approval as wire_approval
from airlock.common.wire.verb import Stub
from airlock.runner import agent, arguments, credentials, outputlog, review
from airlock.runner.control import JobControl, signal_name
from airlock.runner.evidence import StageResult
from airlock.runner.fileop_verbs import FileVerbs
from airlock.runner.identity import build_env, check_cwd, default_cwd, resolve_identity
from airlock.runner.passkeys import PasskeyWriter
from airlock.runner.proctree import ProcEvents
from airlock.runner.spawn import JobResult, JobSpec, run_job, running_key, systemd_is_running

NAME = "runner"
# Deferred end records (issue 21): how many one `sync` asks about, and how long
# to wait for a journal that does not answer before giving up on them.
CONFIRM_BATCH = 256
CONFIRM_SECONDS = 60.0
MAX_UNCONFIRMED = 10_000
# What an exec reply may take of intake's reply limit; the rest is the envelope's.
REPLY_ROOM = MAX_REPLY_BYTES - 64 * 1024
# Output logs (issue 35): retention runs at most this often; a follower hears from us at least this often.
PRUNE_EVERY_SECONDS = 60.0
FOLLOW_TICK_SECONDS = 10.0
# exec.finished's exec tree takes at most this much, and the room left after the rest of the record;
# KILLED_BYTES is kept for an operator's kill (who, signal, a reason of KILL_REASON_CHARS at most).
TREE_BYTES = 32 * 1024
KILL_REASON_CHARS = 1024
KILLED_BYTES = 8 * 1024
MIN_TREE_BYTES = 1024
MAX_LISTED = 256  # running jobs one `running` lists


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
        # Deferred exec.finished records not yet confirmed durable: mark -> the event (issue 21).
        self.unconfirmed: dict[str, dict[str, Any]] = {}
        self._confirm_wake = asyncio.Event()
        self._confirmer: asyncio.Task[None] | None = None
        # Issue 35: running jobs' output logs by file name (followed live), and when retention last ran.
        self.logs: dict[str, outputlog.OutputLog] = {}
        self._pruned_at = -float("inf")
        self._pruner: asyncio.Task[None] | None = None  # held: an unreferenced task may be collected
        # Exec trees (issue 35): one process-events listener for every job; live control per running job.
        self.events = ProcEvents(config.runner.exec_tree_source)
        self.controls: dict[tuple[int, str], tuple[str | None, JobControl]] = {}  # key -> (request ID, control)

    def containment(self) -> str:
        mode = self.config.runner.containment
        if mode == "auto":
            return "service" if systemd_is_running() and os.geteuid() == 0 else "process-group"
        return mode

    async def _refuse(self, exc: AirlockError, ids: Ids, after: list[str] | None = None) -> AirlockError:
        try:
            await self.audit.record(
                "exec.refused", ids, payload={"code": exc.code.value, "message": exc.message}, after=after
            )
        except AirlockError:
            pass  # the refusal stands whether or not it could be journaled
        return exc

    async def exec(self, call: Call) -> dict[str, Any]:
        # Approval may reach this socket to cancel; only intake may ask for work.
        if self.intake_uid is None or call.peer.uid != self.intake_uid:
            self.log.warning("runner.peer.refused", verb="exec", peer_uid=call.peer.uid, peer_pid=call.peer.pid)
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        a = call.args
        request_id = validate.optional_text("request_id", a.get("request_id"), max_len=256)
        operation_id = validate.text("operation_id", a.get("operation_id"), max_len=256, allow_empty=False)
        session = validate.optional_text("session", a.get("session"), max_len=256)
        ids = Ids(request_id, operation_id, None, session)
        # Operation IDs belong to their agent (issue 14): another agent's running
        # operation of the same ID is neither blocked nor revealed.
        key = running_key(a.get("spec"), operation_id)
        if key in self.running:
            raise await self._refuse(
                AirlockError(ErrorCode.OPERATION_IN_PROGRESS, "this operation is already running"), ids
            )
        # Registered before the first await, so that a cancel arriving while the
        # ticket is redeemed or the scope created is not lost: the job then never starts.
        cancel = asyncio.Event()
        self.running[key] = cancel
        control = JobControl(self.events, self.config.runner.exec_tree_max, cancel)
        self.controls[key] = (request_id, control)
        try:
            return await self._exec(call, operation_id, ids, cancel, control)
        finally:
            self.running.pop(key, None)
            self.controls.pop(key, None)

    async def _exec(
        self, call: Call, operation_id: str, ids: Ids, cancel: asyncio.Event, control: JobControl
    ) -> dict[str, Any]:
        a = call.args
        after: list[str] = []
        try:
            # The request's deferred records (request.received, approval.decided):
            # exec.started commits only together with them, or not at all.
            after = marks_of(a.get("after"))
            spec = ExecSpec.from_dict(a.get("spec"))
            ids = Ids(ids.request_id, ids.operation_id, spec.uid, ids.session)
            stream = validate.boolean("stream", a.get("stream"), False)
            job, added, decided = await self._prepare(spec, a, operation_id)
            # A rule's credentials (issue 35): checked and read now, values only ever redacted.
            loaded = credentials.load(a.get("bound"), job)
            job = loaded.apply(job)
            control.protected = job.protected_values  # the exec tree's argv is redacted like the output
        except AirlockError as exc:
            # Every refusal before exec.started is journaled: nothing ran.
            raise await self._refuse(exc, ids, after) from None
        if decided is not None and decided not in after:
            after.append(decided)  # from approval itself, whatever intake passed on
        try:
            # The end record must fit, or the job never starts (issue 29): checked before
            # exec.started, so a request can never run without its exec.finished.
            # The exec tree takes what room is left (at most TREE_BYTES).
            fits = end_record_fits(job, self.config.journal.output_head_bytes)
            tree_room = min(TREE_BYTES, MAX_PAYLOAD_BYTES - fits - KILLED_BYTES)
        except AirlockError as exc:
            raise await self._refuse(exc, ids, after) from None
        digest = spec.digest()
        # The output log's name is journaled with the start; the log itself exists once that is durable.
        log_name = outputlog.new_name() if self.config.runner.output_log_max_bytes > 0 else None
        control.summary = {
            "stages": [list(argv) for argv in spec.stages],
            "agent_uid": spec.uid,
            "uid": job.identity.uid,
            "containment": job.containment,
            "started_at": iso_utc(time.time()),
        }
        await self.audit.record(
            "exec.started",
            ids,
            # Variables the runner added are journaled by name only: the agent socket's
            # path is a value from the peer's own environment.
            payload={
                "digest": digest,
                "spec": spec_record(spec.to_dict()),
                "uid": job.identity.uid,
                "gid": job.identity.gid,
                "cwd": job.cwd,
                "containment": job.containment,
                "added_env": added,
                "binaries": [dict(b) for b in job.binaries or ()],
                "sandbox": [dict(sb) for sb in job.sandboxes] if job.sandboxes else None,
            }
            | ({"arguments": [dict(a) for a in job.arguments]} if job.arguments else {})
            | ({"credentials": loaded.record()} if loaded.items else {})
            | ({"output_log": log_name} if log_name is not None else {}),
            after=after,
        )
        log = self._output_log(job, ids, log_name)

        # Output events go out in order through one queue, all before the final reply.
        chunks: asyncio.Queue[tuple[str, int, bytes] | None] = asyncio.Queue()

        async def forward() -> None:
            while (item := await chunks.get()) is not None:
                name, stage, chunk = item
                await call.emit(name, {"stream": name, "stage": stage, "data": base64.b64encode(chunk).decode()})

        forwarder = asyncio.create_task(forward()) if stream else None
        try:
            result = await run_job(
                job,
                on_output=(lambda n, i, c: chunks.put_nowait((n, i, c))) if stream else None,
                cancel=cancel,
                log=log,
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
            kept = await self._close_log(log)
        evidence = result.to_evidence() | {
            "operation_id": operation_id,
            "cwd": job.cwd,
            "uid": job.identity.uid,
            "gid": job.identity.gid,
            "hostname": socket.gethostname(),
        }
        summary = _audit_summary(evidence, self.config.journal.output_head_bytes, result)
        if kept is not None:
            summary["output_log"] = kept
        # What the job executed and who killed it go to the journal only: the agent's reply is as before.
        tree = control.tree(tree_room) if tree_room >= MIN_TREE_BYTES else None
        if tree is not None:
            summary["tree"] = tree
        elif control.watch is not None:  # a record this full has no room for it (_MARGIN holds this line)
            summary["tree"] = {"source": self.events.source, "unavailable": "no room left in exec.finished"}
        if control.killed is not None:
            killed = control.killed
            if tree_room < 0:  # no room kept for the reason either
                killed = {k: v for k, v in killed.items() if k != "reason"} | {"reason_omitted": True}
            summary["killed"] = killed
        evidence = fit_reply(evidence)
        try:
            if result.cancelled:
                await self.audit.record("exec.cancelled", ids, payload={"digest": digest, "started": result.started})
            # Deferred (issue 21): intake's request.replied names the mark and commits
            # only with it; `_confirm` makes sure it lands even if the journal restarts.
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
                evidence["audit_mark"] = mark
                self._unconfirmed(mark, finished)
        except AirlockError as exc:
            # The work ran: its evidence goes back whatever the journal says.  An
            # error here would make intake abandon the operation, and a retry would
            # run the command a second time.
            self.log.error("runner.audit.unrecorded", operation_id=operation_id, code=exc.code.value, error=exc.message)
        return evidence

    def _output_log(self, job: JobSpec, ids: Ids, name: str | None) -> outputlog.OutputLog | None:
        """This job's output log (outputlog.py), or None when runner.output_log_max_bytes is 0."""
        settings = self.config.runner
        if name is None:
            return None
        header = {"operation_id": ids.operation_id, "request_id": ids.request_id, "uid": job.owner_uid}
        log = outputlog.OutputLog(settings.output_dir, name, settings.output_log_max_bytes, header)
        self.logs[log.name] = log
        return log

    async def _close_log(self, log: outputlog.OutputLog | None) -> dict[str, Any] | None:
        if log is None:
            return None
        # The fsync off the loop (other jobs' output keeps flowing); followers are ended on it.
        kept = await asyncio.to_thread(log.finish) if log.stored else log.finish()
        log.end_followers()
        self.logs.pop(log.name, None)
        if kept.get("failed"):
            self.log.error("runner.output_log.failed", file=log.name, error=kept["failed"])
        now = asyncio.get_running_loop().time()
        if now - self._pruned_at >= PRUNE_EVERY_SECONDS:  # retention: at most once a minute, off the loop
            self._pruned_at = now
            self._pruner = asyncio.get_running_loop().create_task(self._prune(), name="runner-prune")
        return kept

    async def _prune(self) -> None:
        settings = self.config.runner
        try:
            removed = await asyncio.to_thread(
                outputlog.prune,
                settings.output_dir,
                max_age=settings.output_log_max_age_seconds,
                total=settings.output_log_total_bytes,
                keep=frozenset(self.logs),
            )
        except OSError as exc:  # retention tries again after the next job
            self.log.error("runner.output_log.prune_failed", error=exc.strerror or type(exc).__name__)
            return
        if removed:
            self.log.info("runner.output_log.pruned", count=len(removed))

    async def output(self, call: Call) -> dict[str, Any]:
        """approval, for an operator: a job's stored output log, or (``follow``) its output as it comes.

        Only approval's uid (the operator door) may ask; the agent door has no such verb.
        """
        if self.approval_uid is None or call.peer.uid != self.approval_uid:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        name = call.args.get("file")
        if not outputlog.valid_name(name):
            raise validate.bad("file", "is not an output log's name")
        assert isinstance(name, str)
        if validate.boolean("follow", call.args.get("follow"), False):
            running = self.logs.get(name)
            if running is not None:
                return await self._follow(call, running)
        settings = self.config.runner
        found = await asyncio.to_thread(outputlog.read, settings.output_dir, name, settings.output_log_max_bytes)
        return {
            "file": name,
            "running": False,
            "complete": found["complete"],
            "chunks": [
                {"stream": n, "stage": s, "ms": ms, "data": base64.b64encode(d).decode()}
                for n, s, ms, d in found["chunks"]
            ],
            "streams": found["streams"],
        }

    async def _follow(self, call: Call, log: outputlog.OutputLog) -> dict[str, Any]:
        follower = log.follow()
        try:
            while True:
                got, dropped, ended = await outputlog.next_chunks(log, follower, FOLLOW_TICK_SECONDS)
                if dropped:
                    await call.emit("dropped", {"bytes": dropped})
                for kind, stage, data in got:
                    name = outputlog.KINDS[kind]
                    await call.emit(name, {"stream": name, "stage": stage, "data": base64.b64encode(data).decode()})
                if ended:
                    return {"file": log.name, "running": False, "ended": True}
                if not got and not dropped:
                    await call.emit("tick", {})  # the reader learns the job still runs (and its wait stays bounded)
        finally:
            log.followers.discard(follower)

    def _unconfirmed(self, mark: str, event: dict[str, Any]) -> None:
        if len(self.unconfirmed) >= MAX_UNCONFIRMED:  # the journal has not answered for long: bounded
            dropped = next(iter(self.unconfirmed))
            gone = self.unconfirmed.pop(dropped)
            self.log.error(
                "runner.audit.unrecorded",
                operation_id=gone.get("operation_id"),
                code="audit_unavailable",
                error="too many end records waiting for the journal's confirmation",
            )
        self.unconfirmed[mark] = event
        self._confirm_wake.set()
        if self._confirmer is None or self._confirmer.done():
            self._confirmer = asyncio.get_running_loop().create_task(self._confirm(), name="runner-confirm")

    async def _confirm(self) -> None:
        """Off the critical path: ask the journal which deferred end records it lost (a restart
        between queueing and commit, a failed transaction) and append those again."""
        while True:
            await self._confirm_wake.wait()
            self._confirm_wake.clear()
            marks = list(self.unconfirmed)[:CONFIRM_BATCH]
            if len(self.unconfirmed) > len(marks):
                self._confirm_wake.set()
            deadline = asyncio.get_running_loop().time() + CONFIRM_SECONDS
            lost: list[str] | None = None
            while lost is None:
                try:
                    found = await self.audit.client.call("sync", {"marks": marks, "writer": "runner"}, timeout=10)
                    lost = [m for m in found.get("lost") or [] if m in marks]
                except AirlockError as exc:
                    if asyncio.get_running_loop().time() >= deadline:
                        lost = marks
                        self.log.warning("runner.audit.unconfirmed", count=len(marks), error=exc.message)
                    else:
                        await asyncio.sleep(0.2)
            events = [self.unconfirmed.pop(m) for m in marks]
            for mark, event in zip(marks, events, strict=True):
                if mark not in lost:
                    continue
                try:
                    await self.audit.ensure(event)
                except AirlockError as exc:
                    self.log.error(
                        "runner.audit.unrecorded",
                        operation_id=event.get("operation_id"),
                        code=exc.code.value,
                        error=exc.message,
                    )

    async def _prepare(
        self, spec: ExecSpec, a: Mapping[str, Any], operation_id: str
    ) -> tuple[JobSpec, list[str], str | None]:
        """Re-check the request, redeem its ticket, and build the job; raises if it must not run."""
        ticket = validate.text("ticket", a.get("ticket"), max_len=256, allow_empty=False)
        protected = validate.env_map("protected_env", a.get("protected_env"))
        # Defence in depth: the same rules intake applied, checked again here.
        for name in [*spec.env, *protected]:
            if name == agent.NAME or not validate.env_allowed(name, self.config.env.allow):
                raise validate.bad(f"env.{name}", "is not in the environment allowlist")
        if sorted(protected) != sorted(spec.protected_names):
            raise validate.bad("protected_env", "names do not match the approved request")
        ceiling = self.config.limits.max_output_bytes
        validate.integer("max_output_bytes", spec.max_output_bytes, minimum=1, maximum=ceiling)
        bound = validate.mapping("bound", a.get("bound"))
        redeem = wire_approval.Redeem(ticket, spec.digest(), bound)
        decided = (await Stub(wire_approval.DOOR, self.approval).call(wire_approval.REDEEM, redeem)).mark
        # What approval resolved, now redeemed: the files to run (checked again when opened),
        # and a root job's changeable path arguments (checked again just before it starts).
        binaries = binary.parse_bound(bound.get("binaries"), len(spec.stages))
        bound_arguments = argparse_bound(bound.get("arguments"), spec.stages)
        if bound_arguments and not spec.privileged:
            raise validate.bad("bound.arguments", "are bound for root jobs only")

        check_privilege(spec.run_as, os.geteuid(), privileged=spec.privileged)
        identity = resolve_identity(spec.run_as)
        cwd = spec.cwd or default_cwd(identity)
        check_cwd(identity, cwd)

        env = build_env(identity, spec.env, protected)
        # Set after the allowlist checks above, which refuse SSH_AUTH_SOCK from the request.
        added: list[str] = []
        if spec.forward_agent:
            pid, peer_uid = _peer_process(a.get("peer"), spec.uid)
            forwarded = agent.agent_socket(pid, peer_uid, identity)
            if forwarded is not None:
                env[agent.NAME] = forwarded
                added.append(agent.NAME)
        mode = self.containment()
        containment: Literal["service", "scope", "process-group"] = (
            "service" if mode == "service" else "scope" if mode == "scope" else "process-group"
        )
        job = JobSpec(
            operation_id=operation_id,
            mode="shell" if spec.mode == "shell" else "exec",
            stages=spec.stages,
            identity=identity,
            env=env,
            cwd=cwd,
            stdin=base64.b64decode(spec.stdin) if spec.stdin else None,
            timeout_seconds=(
                spec.timeout_ms / 1000 if spec.timeout_ms is not None else self.config.limits.default_timeout_seconds
            ),
            # 0 is an absolute time (the epoch, long past), not "no deadline".
            deadline=spec.deadline_ms / 1000 if spec.deadline_ms is not None else None,
            max_output_bytes=spec.max_output_bytes or ceiling,
            max_total_output_bytes=self.config.limits.max_total_output_bytes,
            kill_grace_seconds=self.config.limits.kill_grace_seconds,
            protected_values=tuple(v for v in protected.values() if v),
            containment=containment,
            slice=self.config.runner.slice,
            memory_max=self.config.runner.memory_max,
            tasks_max=self.config.runner.tasks_max,
            cpu_quota=self.config.runner.cpu_quota,
            binaries=tuple(binaries),
            owner_uid=spec.uid,
            sandboxes=sandbox.parse_bound(bound.get("sandbox"), len(spec.stages)),
            arguments=tuple(bound_arguments) or None,
        )
        return job, added, decided

    async def inspect(self, call: Call) -> dict[str, Any]:
        """approval, at decide time: a root job's path arguments that someone other than root can change.

        The runner answers because it is root (approval may not see the files)
        and because it is the one that must find the same files before the job
        starts (runner/arguments.py).
        """
        if self.approval_uid is None or call.peer.uid != self.approval_uid:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        spec = ExecSpec.from_dict(call.args.get("spec"))
        programs = call.args.get("programs")
        if not isinstance(programs, list) or len(programs) != len(spec.stages):
            raise validate.bad("programs", "must name each stage's canonical binary")
        programs = [validate.text(f"programs[{i}]", p, max_len=4096) for i, p in enumerate(programs)]
        if not spec.privileged:
            return {"arguments": []}
        cwd = spec.cwd or default_cwd(resolve_identity(spec.run_as))
        found = await asyncio.to_thread(
            arguments.inspect,
            spec.stages,
            programs,
            cwd,
            cwd_given=spec.cwd is not None,
            root=arguments.view(self.containment()),
        )
        return {"arguments": found}

    async def review(self, call: Call) -> dict[str, Any]:
        """approval, for an ask: run the configured reviewer on the statement it sends (runner/review.py)."""
        if self.approval_uid is None or call.peer.uid != self.approval_uid:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        statement = call.args.get("statement")
        if not isinstance(statement, dict):
            raise validate.bad("statement", "must be an object")
        report = await review.review(self.config, statement, systemd=self.containment() != "process-group")
        self.log.info(
            "runner.review.finished",
            request_id=statement.get("request_id") if isinstance(statement.get("request_id"), str) else None,
            ran=report.get("ran"),
            exit_code=report.get("exit_code"),
            timed_out=report.get("timed_out"),
            why=report.get("why"),
        )
        return report

    async def kill(self, call: Call) -> dict[str, Any]:
        """approval, for an operator: signal a running job (``ref``: its request or operation ID)."""
        if self.approval_uid is None or call.peer.uid != self.approval_uid:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        a = call.args
        ref = validate.text("ref", a.get("ref"), max_len=256, allow_empty=False)
        uid = validate.integer("uid", a.get("uid"))  # AGENT/ID: that agent's only
        signum = kill_signal(a.get("signal"))
        by = validate.text("by", a.get("by"), max_len=256, allow_empty=False)
        reason = validate.text("reason", a.get("reason") or "", max_len=KILL_REASON_CHARS)
        found = [
            (key, request_id, control)
            for key, (request_id, control) in self.controls.items()
            if ref in (key[1], request_id) and uid in (None, key[0])
        ]
        if not found:
            raise AirlockError(ErrorCode.NOT_FOUND, f"no running job has ID {ref!r}")
        if len(found) > 1:
            raise AirlockError(
                ErrorCode.CONFLICT,
                f"{len(found)} agents have a running job with ID {ref!r}; name one as AGENT/ID",
                {"owners": sorted({key[0] for key, _, _ in found})},
            )
        (owner, operation_id), request_id, control = found[0]
        if validate.boolean("dry", a.get("dry"), False):  # approval journals whom it kills first
            return {"operation_id": operation_id, "request_id": request_id, "agent_uid": owner}
        was = await control.kill(signum, by, reason)
        self.log.info(
            "runner.job.killed", operation_id=operation_id, request_id=request_id, signal=signal_name(signum), by=by
        )
        return {
            "operation_id": operation_id,
            "request_id": request_id,
            "agent_uid": owner,
            "signal": signal_name(signum),
            "was": was,
        }

    async def running_jobs(self, call: Call) -> dict[str, Any]:
        """approval, for an operator's `running` (and `airlock watch`): the commands running now."""
        if self.approval_uid is None or call.peer.uid != self.approval_uid:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        jobs = [
            {"operation_id": op, "request_id": request_id} | control.summary
            for (_owner, op), (request_id, control) in list(self.controls.items())[:MAX_LISTED]
            if control.summary
        ]
        return {"running": jobs}

    async def cancel(self, call: Call) -> dict[str, Any]:
        operation_id = validate.text("operation_id", call.args.get("operation_id"), max_len=256, allow_empty=False)
        # intake names the agent whose operation it is; an operator (through approval) may cancel any.
        uid = validate.integer("uid", call.args.get("uid"))
        events = [e for (owner, op), e in self.running.items() if op == operation_id and uid in (None, owner)]
        if not events:
            raise AirlockError(ErrorCode.NOT_FOUND, f"operation {operation_id!r} is not running")
        for event in events:
            event.set()
        return {"operation_id": operation_id, "cancelling": True}


KILL_SIGNALS = frozenset({"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"})


def kill_signal(untrusted: Any) -> int:
    """A signal an operator may send a job: a name from `KILL_SIGNALS` (with or without SIG), default TERM."""
    name = "TERM" if untrusted is None else validate.text("signal", untrusted, max_len=16, allow_empty=False)
    name = name.upper().removeprefix("SIG")
    if name not in KILL_SIGNALS:
        raise validate.bad("signal", "must be one of " + ", ".join(sorted(KILL_SIGNALS)))
    return int(getattr(signal, "SIG" + name))


def _peer_process(untrusted: Any, uid: int) -> tuple[int, int]:
    """The requesting process (pid, uid) as intake identified it; it must be the spec's uid."""
    if not isinstance(untrusted, dict):
        raise validate.bad("peer", "the requesting process is needed for forward_agent")
    pid = validate.integer("peer.pid", untrusted.get("pid"), minimum=1)
    peer_uid = validate.integer("peer.uid", untrusted.get("uid"))
    if pid is None or peer_uid is None:
        raise validate.bad("peer", "pid and uid are needed for forward_agent")
    if peer_uid != uid:
        raise validate.bad("peer.uid", "is not the uid of the approved request")
    return pid, peer_uid


# A stage's argv (or stdin) past this many bytes is named by digest in exec.started:
# request.received holds it whole, and a record need not repeat it (issue 29, issue 39 item 7).
SPELLED_OUT_BYTES = 1024


def spec_record(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as ``exec.started`` journals it: a large argv or stdin by digest and size, the rest as it is.

    ``digest`` (of the whole spec) next to it binds it to ``request.received``'s.
    """
    out = dict(spec)
    out["stages"] = [
        list(argv)
        if len(canonical_json(list(argv))) <= SPELLED_OUT_BYTES
        else {"argv_sha256": argv_digest(argv), "argv_bytes": len(canonical_json(list(argv)))}
        for argv in spec["stages"]
    ]
    stdin = spec.get("stdin")
    if isinstance(stdin, str) and len(stdin) > SPELLED_OUT_BYTES:
        out["stdin"] = {"sha256": hashlib.sha256(stdin.encode()).hexdigest(), "bytes": len(stdin)}
    return out


def argv_digest(argv: Any) -> str:
    """The SHA-256 of a stage's argv as canonical JSON: how records after ``request.received`` name it."""
    return hashlib.sha256(canonical_json(list(argv))).hexdigest()


def fit_reply(evidence: dict[str, Any], room: int = REPLY_ROOM) -> dict[str, Any]:
    """The evidence as it can be sent: without its output when the reply would not fit what intake reads.

    limits.max_total_output_bytes keeps a reply well inside ``room``; this is the
    last word, so that a job that ran always gets an answer intake can settle
    (a reply intake could not read would leave the operation unsettled, and a
    retry would run the job again).  Digests, sizes and exit codes stay.
    """
    output = len(evidence["stdout"]) + sum(len(stage["stderr"]) for stage in evidence["stages"])
    rest = {k: v for k, v in evidence.items() if k not in ("stdout", "stages")}
    rest["stages"] = [{k: v for k, v in stage.items() if k != "stderr"} for stage in evidence["stages"]]
    if output + len(canonical_json(rest)) <= room:
        return evidence
    return evidence | {
        "stdout": "",
        "stdout_truncated": evidence["stdout_truncated"] or bool(evidence["stdout"]),
        "stages": [
            stage | {"stderr": "", "stderr_truncated": stage["stderr_truncated"] or bool(stage["stderr"])}
            for stage in evidence["stages"]
        ],
        "output_retained": False,
    }


def _audit_summary(evidence: dict[str, Any], head: int, result: JobResult) -> dict[str, Any]:
    """The evidence without output bytes: digests and sizes (and a configured head).

    argv is named by digest (``argv_sha256``, ``argv_bytes``), not repeated
    (issue 29): ``request.received`` holds it, so the end record's size does not
    grow with the request and always fits the journal's payload cap
    (`end_record_fits`); `airlock show` reads argv from the first record.
    """
    out = {k: v for k, v in evidence.items() if k not in ("stdout", "stages")}
    out["stdout_bytes"] = len(result.stdout)
    out["stages"] = [
        {k: v for k, v in stage.items() if k not in ("stderr", "argv")}
        | {
            "argv_sha256": argv_digest(r.argv),
            "argv_bytes": len(canonical_json(list(r.argv))),
            "stderr_bytes": len(r.stderr),
        }
        for stage, r in zip(evidence["stages"], result.stages, strict=True)
    ]
    out["exit_codes"] = [s.exit_code for s in result.stages]
    if head:
        out["stdout_head"] = base64.b64encode(result.stdout[:head]).decode()
    return out


# Stand-ins for what only the run tells: as long as any real value can be.
_WORST_INT = -(2**63)
_WORST_UNIT = "u" * 256  # systemd's longest unit name
_WORST_TIME = "2026-01-01T00:00:00.000000+00:00"
_MARGIN = 512


def end_record_fits(job: JobSpec, head: int) -> int:
    """The size of the largest ``exec.finished`` payload this job can produce; refused if it cannot fit.

    The end record is built by the same code (`_audit_summary`) from a result
    whose every run-time value is as long as it can be: so a job starts only
    when its end record is known to fit the journal's `MAX_PAYLOAD_BYTES`.
    """
    stages = tuple(
        StageResult(
            argv=tuple(argv),
            resolved=str((job.binaries[i] if job.binaries and i < len(job.binaries) else {}).get("path") or "/" * 4096),
            exit_code=_WORST_INT,
            signal=_WORST_INT,
            stderr=b"",
            stderr_truncated=True,
            stderr_sha256="0" * 64,
            cpu_usec=_WORST_INT,
            memory_peak_bytes=_WORST_INT,
            unit=_WORST_UNIT,
        )
        for i, argv in enumerate(job.stages)
    )
    result = JobResult(
        operation_id=job.operation_id,
        mode=job.mode,
        stages=stages,
        stdout=b"\xff" * head,
        stdout_truncated=True,
        stdout_sha256="0" * 64,
        started_at=_WORST_TIME,
        ended_at=_WORST_TIME,
        duration_ms=_WORST_INT,
        timed_out=True,
        timeout_reason="deadline",
        cancelled=True,
        containment=job.containment,
        scope_unit=_WORST_UNIT,
        started=True,
        cwd=job.cwd,
        uid=_WORST_INT,
        gid=_WORST_INT,
        total_output_truncated=True,
    )
    evidence = result.to_evidence() | {
        "operation_id": job.operation_id,
        "cwd": job.cwd,
        "uid": _WORST_INT,
        "gid": _WORST_INT,
        "hostname": "h" * 64,  # HOST_NAME_MAX
    }
    # Room for a small field the evidence may gain before this stand-in learns of it.
    size = len(canonical_json(_audit_summary(evidence, head, result))) + _MARGIN
    size += outputlog.worst_summary_bytes(len(job.stages))  # exec.finished's output_log (issue 35)
    if size > MAX_PAYLOAD_BYTES:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS,
            f"the request's end record (exec.finished) could be {size} bytes, over the audit journal's limit "
            f"of {MAX_PAYLOAD_BYTES}: nothing ran (fewer stages, a shorter working directory or a smaller "
            "journal.output_head_bytes)",
            {"field": "pipeline", "end_record_bytes": size, "limit_bytes": MAX_PAYLOAD_BYTES},
        )
    return size


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    runner = Runner(config)
    if config.runner.exec_tree_max > 0:
        runner.events.open()
        if runner.events.unavailable is not None:
            runner.log.warning("runner.tree.unavailable", error=runner.events.unavailable)
    file_verbs = FileVerbs(runner)
    passkeys = PasskeyWriter(config)
    door = Door(
        "runner",
        # approval's uid: an operator's cancel, and files_preview (the operator's diff of a
        # pending write); exec and files refuse every peer but intake's.
        allow=AllowList.of([config.services.intake_user, config.services.approval_user], []),
        verbs={
            "exec": runner.exec,
            "cancel": runner.cancel,
            "kill": runner.kill,
            "running": runner.running_jobs,
            "inspect": runner.inspect,
            "review": runner.review,
            "output": runner.output,
            "files": file_verbs.files,
            "files_preview": file_verbs.files_preview,
            "passkeys.write": passkeys.write,
        },
        max_line=config.limits.max_request_bytes * 2,
    )
    service = Service(NAME, config, [door])
    lifecycle(service, runner.audit)
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)
