"""A job's spec: what to run, as whom, within which limits, checked when built.

`JobSpec` is frozen and validated in ``__post_init__``; spawn.py runs it.
`running_key` names a running job (exec and files alike).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from airlock.common import sandbox
from airlock.common.containment import Containment
from airlock.common.errors import AirlockError, ErrorCode
from airlock.runner.identity import Identity, encodable


def _invalid(message: str) -> AirlockError:
    return AirlockError(ErrorCode.INVALID_ARGUMENTS, message)


def running_key(untrusted_spec: Any, operation_id: str) -> tuple[int, str]:
    """The key of a running job: operation IDs belong to their agent (issue 14), exec and files alike."""
    owner = untrusted_spec.get("uid") if isinstance(untrusted_spec, dict) else None
    return (owner if isinstance(owner, int) and not isinstance(owner, bool) else -1, operation_id)


@dataclass(frozen=True, slots=True)
class JobSpec:
    operation_id: str
    mode: Literal["exec", "shell"]
    stages: tuple[tuple[str, ...], ...]  # shell mode: (("/bin/sh", "-c", command),)
    identity: Identity
    env: Mapping[str, str]
    cwd: str
    stdin: bytes | None  # None: /dev/null
    timeout_seconds: float
    deadline: float | None  # absolute, epoch seconds
    max_output_bytes: int  # per stream
    kill_grace_seconds: float
    protected_values: tuple[str | bytes, ...]  # redacted from output (credentials' values are bytes)
    containment: Containment  # a mode's name is taken too (tests, tools), and held as the enum
    slice: str = "airlock-jobs.slice"
    memory_max: str | None = None
    tasks_max: int = 0
    cpu_quota: str | None = None
    umask: int = 0o022  # the job's, not the daemon's (which may be stricter)
    # The identities approval bound (bound["binaries"], one per stage): the
    # runner executes these paths' files and nothing else.  None (tests, tools):
    # argv[0] is resolved here, on the target user's default PATH.
    binaries: tuple[Mapping[str, Any], ...] | None = None
    owner_uid: int | None = None  # who asked: operation IDs are per agent, so is the scope's name
    # Each stage's rule's sandbox as approval bound it (bound["sandbox"]), its unit properties
    # computed once when it was parsed; service containment only.
    sandboxes: tuple[sandbox.Sandbox, ...] | None = None
    # All streams of all stages together (limits.max_total_output_bytes); None: only the per-stream cap.
    max_total_output_bytes: int | None = None
    # A root job's changeable path arguments as approval bound them (bound["arguments"],
    # common/arguments.py): checked again just before the job starts; scripts run from sealed copies.
    arguments: tuple[Mapping[str, Any], ...] | None = None
    # Each stage's credentials as (name, value) pairs, as the runner read them (runner/credentials.py);
    # service containment only.
    credentials: tuple[tuple[tuple[str, bytes], ...], ...] | None = None
    # Issue 48: a privileged job as another account (sudo -u) gets a root job's checks (binaries root's alone).
    privileged: bool = False

    @property
    def trusted(self) -> bool:
        """Whether the job runs with privilege: root's, or another account's on root's authority."""
        return self.identity.uid == 0 or self.privileged

    def __post_init__(self) -> None:
        if self.mode not in ("exec", "shell"):
            raise _invalid(f"mode must be exec or shell (got {self.mode!r})")
        if not self.stages or any(not stage for stage in self.stages):
            raise _invalid("a job needs at least one stage, and every stage an argv")
        if any(not isinstance(arg, str) or "\0" in arg for stage in self.stages for arg in stage):
            raise _invalid("argv entries must be strings without NUL bytes")
        strings = [arg for stage in self.stages for arg in stage] + [self.cwd, *self.env.keys(), *self.env.values()]
        if not all(encodable(text) for text in strings):
            raise _invalid("argv, cwd and environment must be encodable (no lone surrogates)")
        if self.mode == "shell" and len(self.stages) != 1:
            raise _invalid("a shell job has exactly one stage")
        try:
            object.__setattr__(self, "containment", Containment(self.containment))
        except ValueError:
            modes = ", ".join(Containment)
            raise _invalid(f"containment must be one of {modes} (got {self.containment!r})") from None
        if self.sandboxes is not None and len(self.sandboxes) != len(self.stages):
            raise _invalid("a job needs one sandbox (empty: none) per stage")
        if any(self.sandboxes or ()) and self.containment is not Containment.SERVICE:
            raise AirlockError(
                ErrorCode.SPAWN_FAILED,
                "this rule's sandbox needs runner.containment: service (systemd), not " + self.containment,
            )
        if any(self.credentials or ()) and self.containment is not Containment.SERVICE:
            raise AirlockError(ErrorCode.SPAWN_FAILED, "credentials need runner.containment: service")
        if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in self.env.items()):
            raise _invalid("environment names must be non-empty without '=' or NUL, values without NUL")
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise _invalid(f"deadline must be a finite time (got {self.deadline})")
        if not self.timeout_seconds > 0:
            raise _invalid(f"timeout must be positive (got {self.timeout_seconds})")
        if (
            self.max_output_bytes < 0
            or (self.max_total_output_bytes or 0) < 0
            or self.kill_grace_seconds < 0
            or self.tasks_max < 0
        ):
            raise _invalid("output cap, kill grace and tasks_max must not be negative")
        if self.binaries is not None and len(self.binaries) != len(self.stages):
            raise _invalid("a job needs one bound binary identity per stage")
