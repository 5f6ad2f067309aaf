"""Starting a job's stages as systemd units (service containment): a transient
service per stage (units.py), or, when no stage's rule needs a service-only
sandbox property, a scope per stage forked by the fork server (forker.py).
spawn.py supervises the job either way.
"""

from __future__ import annotations

from typing import Protocol

from airlock.common.errors import AirlockError
from airlock.runner import arguments, forker, stageunit, units
from airlock.runner.binaries import _Binary
from airlock.runner.containment import (
    _SCOPE_BACKSTOP_SLACK_SECONDS,
    ServiceContainment,
    _write_credential_copies,
    _write_env_file,
    _write_script_copies,
)
from airlock.runner.identity import HeldDir
from airlock.runner.jobspec import JobSpec
from airlock.runner.streams import _Fd


class Job(Protocol):
    """What of spawn.py's job these need (spawn.py imports this module, not the other way round)."""

    spec: JobSpec
    scripts: tuple[arguments.Script, ...]
    binaries: tuple[_Binary, ...]
    fds: list[_Fd]
    services: list[units.StageService]
    stdin: tuple[_Fd, bytes] | None
    cwd: HeldDir

    def pipe(self) -> tuple[_Fd, _Fd]: ...

    def stage_pipes(self, spec: JobSpec, index: int, last: int) -> tuple[_Fd, _Fd, _Fd]: ...


async def services(job: Job, containment: ServiceContainment) -> None:
    """Start every stage as its own transient service, stdio passed as fds."""
    spec = job.spec
    cwd = job.cwd
    last = len(spec.stages) - 1
    next_in: _Fd | None = None
    if spec.stdin is not None:
        next_in, writer = job.pipe()
        job.stdin = (writer, spec.stdin)
    for index, opened in enumerate(job.binaries):
        read_out, write_out, write_err = job.stage_pipes(spec, index, last)
        name = stageunit.stage_name(spec, index)
        scripts = _write_script_copies(name, [s for s in job.scripts if s.stage == index], containment.env_files)
        containment.env_files.append(env_file := _write_env_file(name, spec.env, scripts))
        loaded = _write_credential_copies(name, spec.credentials, index, containment.env_files)
        stage = stageunit.for_stage(
            spec,
            index,
            opened,
            env_file=env_file,
            limits=(*containment.limits, *containment.stage_limits[index], *loaded),
            runtime_max_seconds=spec.timeout_seconds + 2 * spec.kill_grace_seconds + _SCOPE_BACKSTOP_SLACK_SECONDS,
            cwd=cwd.st,
        )
        try:
            service = await units.start_stage(
                stage, (next_in.fd if next_in is not None else None, write_out.fd, write_err.fd)
            )
        except AirlockError as exc:
            raise AirlockError(exc.code, f"stage {index + 1}: {exc.message}", exc.details | {"stage": index}) from None
        _started(job, containment, service, name, (next_in, write_out, write_err))
        next_in = read_out


async def scopes(job: Job, containment: ServiceContainment) -> list[_Fd]:
    """Fork every stage through the fork server, each into its own scope; returns their shut gates."""
    spec = job.spec
    cwd = job.cwd
    last = len(spec.stages) - 1
    server = await forker.server(forker.start_unit)
    next_in: _Fd | None = None
    if spec.stdin is not None:
        next_in, writer = job.pipe()
        job.stdin = (writer, spec.stdin)
    gates: list[_Fd] = []
    runtime_max = spec.timeout_seconds + 2 * spec.kill_grace_seconds + _SCOPE_BACKSTOP_SLACK_SECONDS
    for index, opened in enumerate(job.binaries):
        read_out, write_out, write_err = job.stage_pipes(spec, index, last)
        args = [opened.path, *spec.stages[index][1:]]  # argv[0]: the canonical path policy matched
        scripts = [s for s in job.scripts if s.stage == index]
        sealed = []
        for script in scripts:  # the reviewed bytes in sealed memfds, never the path
            held = _Fd(arguments.seal(script))
            job.fds.append(held)
            sealed.append(held.fd)
        request = forker.Spawn(
            argv=tuple(args),
            env=dict(spec.env),
            uid=spec.identity.uid,
            gid=spec.identity.gid,
            groups=tuple(spec.identity.groups),
            cwd=spec.cwd,
            umask=spec.umask,
            extra_argv=tuple(s.index for s in scripts),
        )
        name = stageunit.stage_name(spec, index, ".scope")
        try:
            child = await server.spawn(
                request,
                next_in.fd if next_in is not None else None,
                write_out.fd,
                write_err.fd,
                opened.fd,
                sealed,
                cwd.fd,
            )
            gate = _Fd(child.gate)
            job.fds.append(gate)  # closed unopened by abort(): the stage then ends unexecuted
            gates.append(gate)
            stage = forker.StageScope(name, child.exited)
            _started(job, containment, stage, name, (next_in, write_out, write_err))
            props = forker.scope_stage_properties(
                f"airlock job {ascii(spec.operation_id)[1:-1]}" + (f" stage {index + 1}" if last else ""),
                spec.slice,
                child.pid,
                spec.kill_grace_seconds,
                runtime_max,
            )
            # runner.memory_max etc., then the rule's own limits (all a scope takes: sandbox.SCOPE_PROPERTIES)
            await stage.start(child.pid, [*props, *containment.limits, *containment.stage_limits[index]])
        except AirlockError as exc:
            raise AirlockError(exc.code, f"stage {index + 1}: {exc.message}", exc.details | {"stage": index}) from None
        next_in = read_out
    return gates


def _started(
    job: Job, containment: ServiceContainment, stage: units.StageService, name: str, ends: tuple[_Fd | None, ...]
) -> None:
    """A stage started (or forked at its gate): from now on abort() stops and collects it; its pipe ends are its own."""
    containment.stages.append(stage)
    job.services.append(stage)
    if containment.unit is None:
        containment.unit = name
    for end in ends:
        if end is not None:
            end.close()
