"""Which containment a job gets (scope.py, units.py): process groups, a
transient scope, or one transient service per stage, and whether systemd is
there to provide the last two.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence

from airlock.common import sandbox
from airlock.common.containment import Containment
from airlock.common.containment import systemd_is_running as systemd_is_running  # spawn.py's import
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.sandbox import cpu_quota_property, memory_property
from airlock.runner import forker, stageunit, units
from airlock.runner.arguments import Script
from airlock.runner.jobspec import JobSpec
from airlock.runner.scope import ProcessGroups, ScopeContainment, ScopeSettings

_SCOPE_BACKSTOP_SLACK_SECONDS = 10.0


def _scope_containment(spec: JobSpec) -> ScopeContainment:
    settings = ScopeSettings(
        slice=spec.slice,
        description=f"airlock job {ascii(spec.operation_id)[1:-1]}",  # printable ASCII for systemctl
        stop_timeout_seconds=spec.kill_grace_seconds,
        memory_max=spec.memory_max,
        tasks_max=spec.tasks_max,
        cpu_quota=spec.cpu_quota,
        # Never before our own timeout, termination and sweep have had their turn.
        runtime_max_seconds=spec.timeout_seconds + 2 * spec.kill_grace_seconds + _SCOPE_BACKSTOP_SLACK_SECONDS,
    )
    return ScopeContainment(units.unit_name(spec.operation_id, spec.owner_uid, None, suffix=".scope"), settings)


class ServiceContainment(ProcessGroups):
    """Every stage in its own transient unit, started outside the runner's sandbox.

    A scope (forker.py: forked by the fork server, at systemd's own cost) when no stage's rule
    needs a service-only sandbox property (`sandbox.SCOPE_PROPERTIES` are not) or credentials;
    otherwise a service per stage (units.py), which systemd starts, sandboxes and stops with what
    is left in it.
    """

    def __init__(self, spec: JobSpec) -> None:
        super().__init__()
        self.scoped = not any(spec.credentials or ()) and all(
            name in sandbox.SCOPE_PROPERTIES
            for sb in spec.sandboxes or ()
            if sb
            for name, _sig, _value in sb.properties
        )
        self.limits: list[sandbox.Property] = []
        if spec.memory_max is not None:
            self.limits.append(memory_property(spec.memory_max))
        if spec.tasks_max > 0:
            self.limits.append(("TasksMax", "t", spec.tasks_max))
        if spec.cpu_quota is not None:
            self.limits.append(cpu_quota_property(spec.cpu_quota))
        # Bad settings fail before anything starts.
        # Each stage's sandbox properties as computed once, when the bound sandbox was parsed.
        self.stage_limits = [list(sb.properties) if sb else [] for sb in spec.sandboxes or [None] * len(spec.stages)]
        self.stages: list[units.StageService] = []  # StageScope when scoped
        self.env_files: list[str] = []

    async def attach(self, pids: Sequence[int]) -> None:
        pass

    def _running(self) -> list[units.StageService]:
        # A service whose main process ended stops and systemd kills the rest; a scope stays while
        # anything of the job is left in it, so it is signalled until it is empty (the sweep).
        return [s for s in self.stages if s.returncode is None or isinstance(s, forker.StageScope)]

    async def signal(self, signum: int) -> None:
        for stage in self._running():
            await stage.kill(signum)

    def signal_now(self, signum: int) -> None:
        for stage in self._running():
            stage.kill_now(signum)

    async def occupied(self) -> bool:
        # A service stops only once systemd killed everything in it; a scope outlives its first
        # process, so what is left in it is swept (SIGTERM, the grace, SIGKILL) like a service's.
        return any(isinstance(stage, forker.StageScope) and stage.occupied() for stage in self.stages)

    def unit_names(self, spec: JobSpec) -> list[str]:
        """Each stage's unit name (a scope's or a service's)."""
        suffix = ".scope" if self.scoped else ".service"
        return [stageunit.stage_name(spec, i, suffix) for i in range(len(spec.stages))]

    async def release(self) -> None:
        for stage in self.stages:
            await stage.release()
        self.remove_env_files()

    def remove_env_files(self) -> None:
        for path in self.env_files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.env_files.clear()


def _write_root_file(filename: str, data: bytes) -> str:
    """A new root-only (0600) file in the runner's runtime directory."""
    dirfd = os.open(units.ENV_DIR, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
    finally:
        os.close(dirfd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return os.path.join(units.ENV_DIR, filename)


def _write_env_file(name: str, env: Mapping[str, str], scripts: Sequence[units.ScriptCopy] = ()) -> str:
    """A root-only file for the unit's EnvironmentFile= (never a unit property: those are world-readable)."""
    return _write_root_file(f"{name}.env", units.env_file_text(env, scripts))


def _write_script_copies(name: str, scripts: Sequence[Script], written: list[str]) -> list[units.ScriptCopy]:
    """A stage's reviewed scripts as root-only copies; the unit's helper seals them into memfds.

    A unit cannot be handed the runner's memfd (systemd 252 passes only stdio
    fds), so it gets a copy only root can change, and checks its hash again.
    """
    out = []
    for script in scripts:
        path = _write_root_file(f"{name}.script{script.index}", script.data)
        written.append(path)  # removed with the environment files
        out.append(units.ScriptCopy(script.index, script.sha256, path))
    return out


def _write_credential_copies(
    name: str, credentials: Sequence[Sequence[tuple[str, bytes]]] | None, stage: int, written: list[str]
) -> list[sandbox.Property]:
    """Stage ``stage``'s credentials as the runner read them, in root-only copies for ``LoadCredential=``.

    Not the rule's own files: systemd would open those again later, and a value rotated in between
    would reach the job without being among the values redacted from its output.
    """
    pairs = []
    for credential, value in credentials[stage] if credentials else ():
        path = _write_root_file(f"{name}.credential.{credential}", value)
        written.append(path)  # removed with the environment files
        pairs.append((credential, path))
    return [("LoadCredential", "a(ss)", pairs)] if pairs else []


def _containment_for(spec: JobSpec) -> ProcessGroups:
    if spec.containment is Containment.PROCESS_GROUP:
        return ProcessGroups()
    if not systemd_is_running():
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, f"{spec.containment} containment needs systemd as PID 1, which is not running"
        )
    if spec.containment is Containment.SERVICE:
        return ServiceContainment(spec)
    return _scope_containment(spec)
