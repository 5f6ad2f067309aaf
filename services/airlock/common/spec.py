"""What is to be executed: the exec spec that approval approves and the runner runs.

The spec is everything that decides what happens on the machine, and only
that: which stages, in which form, as whom, with which environment, where,
with what input and limits.  Its digest binds an approval ticket to exactly
this work and keys operation replay.  Protected values are not in it (only
their names): they are one-shot secrets, never stored (reference/001).

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from airlock.common import validate
from airlock.common.codec import canonical_json
from airlock.common.errors import AirlockError, ErrorCode

SHELL = "/bin/sh"


@dataclass(frozen=True, slots=True)
class ExecSpec:
    mode: str  # "exec" (argv stages joined by pipes) or "shell" (/bin/sh -c STRING)
    stages: tuple[tuple[str, ...], ...]
    privileged: bool
    uid: int  # the peer that asked: the job runs as root when privileged, else as this uid
    env: dict[str, str] = field(default_factory=dict)
    protected_names: tuple[str, ...] = ()
    cwd: str | None = None
    stdin: str | None = None  # base64
    timeout_ms: int | None = None
    deadline_ms: int | None = None
    max_output_bytes: int | None = None
    forward_agent: bool = False
    # Issue 48: another account to run as (sudo -u; a rule's run_as allows it): a privileged job as that
    # uid, with root's checks (env_reset, binaries root's alone).  None: root when privileged.
    user: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("exec", "shell"):
            raise validate.bad("mode", "must be exec or shell")
        if not self.stages:
            raise validate.bad("pipeline", "must not be empty")
        if self.mode == "shell" and (
            len(self.stages) != 1 or self.stages[0][:2] != (SHELL, "-c") or len(self.stages[0]) != 3
        ):
            raise validate.bad("command", "shell form must be a single /bin/sh -c stage")
        if self.forward_agent and self.privileged:
            raise validate.bad("forward_agent", "is only allowed with privileged: false")
        if self.cwd is not None and not self.cwd.startswith("/"):
            raise validate.bad("cwd", "must be an absolute path")
        if self.user is not None and (not self.privileged or self.user in (0, self.uid) or self.user < 0):
            raise validate.bad("user", "names another account than root and the requester, for a privileged job")

    @property
    def run_as(self) -> int:
        if self.user is not None:
            return self.user
        return 0 if self.privileged else self.uid

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "stages": [list(stage) for stage in self.stages],
            "privileged": self.privileged,
            "uid": self.uid,
            "env": dict(sorted(self.env.items())),
            "protected_names": list(self.protected_names),
            "cwd": self.cwd,
            "stdin": self.stdin,
            "timeout_ms": self.timeout_ms,
            "deadline_ms": self.deadline_ms,
            "max_output_bytes": self.max_output_bytes,
            "forward_agent": self.forward_agent,
        } | ({"user": self.user} if self.user is not None else {})  # absent for root: digests stay as they were

    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.to_dict())).hexdigest()

    @classmethod
    def from_dict(cls, untrusted: Any) -> ExecSpec:
        """Rebuild and re-check a spec received from another service (defence in depth)."""
        if not isinstance(untrusted, dict):
            raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "spec must be an object")
        stages_in = untrusted.get("stages")
        if not isinstance(stages_in, list) or not stages_in:
            raise validate.bad("pipeline", "must be a non-empty list of stages")
        stages = tuple(validate.argv(f"pipeline[{i}]", s) for i, s in enumerate(stages_in))
        uid = validate.integer("uid", untrusted.get("uid"))
        if uid is None:
            raise validate.bad("uid", "is required")
        names = untrusted.get("protected_names") or []
        if not isinstance(names, list):
            raise validate.bad("protected_names", "must be a list")
        return cls(
            mode=validate.text("mode", untrusted.get("mode")),
            stages=stages,
            privileged=validate.boolean("privileged", untrusted.get("privileged"), True),
            uid=uid,
            env=validate.env_map("env", untrusted.get("env")),
            protected_names=tuple(validate.env_name("protected_env key", n) for n in names),
            cwd=validate.optional_text("cwd", untrusted.get("cwd")),
            stdin=validate.optional_text("stdin", untrusted.get("stdin"), max_len=2 * 1024 * 1024),
            timeout_ms=validate.integer("timeout_ms", untrusted.get("timeout_ms"), minimum=1),
            deadline_ms=validate.integer("deadline_ms", untrusted.get("deadline_ms"), minimum=0),
            max_output_bytes=validate.integer("max_output_bytes", untrusted.get("max_output_bytes"), minimum=1),
            forward_agent=validate.boolean("forward_agent", untrusted.get("forward_agent"), False),
            user=validate.integer("user", untrusted.get("user"), minimum=1),
        )


def check_privilege(run_as: int, runner_uid: int | None, *, privileged: bool) -> None:
    """A runner that is not root runs work only as its own uid (`airlock dev up`); refuse the rest.

    The one privilege check: intake refuses early, the runner's exec and file
    verbs and the spawn refuse again (defence in depth).  ``runner_uid`` None:
    not known here, so not refused here.
    """
    if runner_uid is None or runner_uid == 0 or run_as == runner_uid:
        return
    what = "privileged requests" if privileged else f"work as another user (uid {run_as})"
    raise AirlockError(
        ErrorCode.PRIVILEGE_UNAVAILABLE,
        f"the runner is not root (uid {runner_uid}), so it cannot run {what}; "
        "use privileged: false (airlock run --no-privilege) or run airlock as root",
        {"uid": run_as},
    )
