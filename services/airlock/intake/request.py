"""An agent's exec request, from either dialect, validated field by field.

Pure: no I/O.  Untrusted ``args`` (native v1) or a reference/000 object go in, an
`ExecRequest` or an `AirlockError` naming the field comes out.  The gates of
the agent door that need no I/O live here: shapes and types, forbidden
characters, freshness, the environment allowlist.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from airlock.common import envrule, shown, validate
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.common.spec import SHELL, ExecSpec

NATIVE_EXEC_FIELDS = frozenset(
    {
        "pipeline",
        "argv",
        "command",
        "privileged",
        "env",
        "protected_env",
        "cwd",
        "stdin",
        "timeout_ms",
        "deadline_ms",
        "max_output_bytes",
        "operation_id",
        "reason",
        "session",
        "host",
        "time",
        "forward_agent",
        "stream",
        "wait",
        "join",
        "user",
    }
)


@dataclass(frozen=True, slots=True)
class ExecRequest:
    request_id: str
    spec: ExecSpec
    protected_env: dict[str, str] = field(repr=False, default_factory=dict)
    operation_id: str | None = None
    reason: str = ""
    session: str = ""
    host: str = ""
    time: str = ""
    stream: bool = False
    wait: bool = True  # False: refuse with approval_required rather than ask a person (sudo -n)
    join: bool = False  # an agent's sudo (issue 48): it may leave while pending; its retry joins (drive.py)

    def describe(self) -> dict[str, Any]:
        """What an operator and the audit record see (never protected values; stdin by size and sha256)."""
        return {
            "request_id": self.request_id,
            "reason": self.reason,
            "session": self.session,
            "host": self.host,
            "time": self.time,
            **shown.journaled(self.spec.to_dict()),
        }


def parse_time(value: Any, config: Config, now: float) -> str:
    """Freshness: ISO 8601, not older than freshness_seconds, not beyond the skew allowance."""
    raw = validate.text("time", value, max_len=64) if value is not None else ""
    if not raw:
        raise validate.bad(
            "time", "missing time field (ISO 8601 is required, e.g. 2026-02-13T14:30:00Z)", ErrorCode.STALE_REQUEST
        )
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise validate.bad("time", f"{raw!r} is not an ISO 8601 timestamp", ErrorCode.INVALID_ARGUMENTS) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    age = now - parsed.timestamp()
    limits = config.limits
    if age > limits.freshness_seconds:
        raise AirlockError(
            ErrorCode.STALE_REQUEST,
            f"time: request too old: {age:.0f}s (max {limits.freshness_seconds:g}s)",
            {"field": "time", "age_seconds": round(age, 3)},
        )
    if -age > limits.clock_skew_seconds:
        raise AirlockError(
            ErrorCode.STALE_REQUEST,
            f"time: request is {-age:.0f}s in the future; the allowed clock skew is {limits.clock_skew_seconds:g}s",
            {"field": "time", "age_seconds": round(age, 3)},
        )
    return raw


def check_env(field_name: str, env: dict[str, str], config: Config, *, privileged: bool = False) -> None:
    for name, value in env.items():
        refused = envrule.refusal(name, value) if privileged else None
        if refused is not None:
            raise validate.bad(f"{field_name}.{name}", refused)
        if name == "SSH_AUTH_SOCK":
            raise validate.bad(
                f"{field_name}.SSH_AUTH_SOCK",
                "SSH_AUTH_SOCK cannot be set in request env; use forward_agent: true (unprivileged only) "
                "to reach your SSH agent",
            )
        if not validate.env_allowed(name, config.env.allow):
            raise validate.bad(
                f"{field_name}.{name}",
                f"is not in the environment allowlist (env.allow: {', '.join(config.env.allow)})",
            )


def _stages_from_native(args: dict[str, Any]) -> tuple[str, tuple[tuple[str, ...], ...]]:
    forms = [key for key in ("pipeline", "argv", "command") if args.get(key) is not None]
    if len(forms) != 1:
        raise validate.bad("pipeline", "give exactly one of pipeline, argv or command")
    form = forms[0]
    if form == "command":
        command = validate.text("command", args["command"], max_len=128 * 1024, allow_empty=False)
        return "shell", ((SHELL, "-c", command),)
    if form == "argv":
        return "exec", (validate.argv("argv", args["argv"]),)
    return "exec", _pipeline(args["pipeline"])


def _pipeline(value: Any) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, list) or not value:
        # reference/000's exact words: a sudo-proxy client (one that predates
        # control actions, or probes for them) matches on this message.
        raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "pipeline must not be empty", {"field": "pipeline"})
    if len(value) > 64:
        raise validate.bad("pipeline", "has more than 64 stages")
    for i, stage in enumerate(value):
        if stage == []:
            # The peer's words too (sudo-proxy clients match on the stage number).
            raise validate.bad(f"pipeline[{i}]", f"pipeline stage {i} must not be empty")
    return tuple(validate.argv(f"pipeline[{i}]", stage) for i, stage in enumerate(value))


def _stdin(value: Any) -> str | None:
    if value is None:
        return None
    raw = validate.text("stdin", value, max_len=2 * 1024 * 1024)
    try:
        base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise validate.bad("stdin", "must be base64") from None
    return raw


# An account name (or #uid) -> its uid, None when there is no such account (intake reads passwd).
Accounts = Callable[[str], "int | None"]


def run_as_account(value: Any, peer: Peer, privileged: bool, accounts: Accounts | None) -> tuple[bool, int | None]:
    """The ``user`` field (issue 48, sudo -u): (privileged, the spec's ``user``) for the account it names.

    Root is a privileged job as ever, the requester itself an unprivileged one;
    any other account is a privileged job as that account (``ExecSpec.user``).
    """
    if value is None:
        return privileged, None
    name = validate.text("user", value, max_len=64, allow_empty=False)
    if accounts is None:
        raise validate.bad("user", "is not accepted in this dialect")
    uid = accounts(name)
    if uid is None:
        raise validate.bad("user", f"no such account {name!r}")
    if uid == peer.uid:
        return False, None
    if not privileged:
        raise validate.bad("user", "a job as another account is privileged: leave out privileged: false")
    return True, (None if uid == 0 else uid)


def _build(
    args: dict[str, Any],
    *,
    request_id: str,
    stages: tuple[tuple[str, ...], ...],
    mode: str,
    peer: Peer,
    config: Config,
    now: float,
    accounts: Accounts | None = None,
) -> ExecRequest:
    # Validation order: the cheap shape checks first, freshness after them.
    reason = validate.text("reason", args.get("reason") or "", max_len=4096)
    session = validate.text("session", args.get("session") or "", max_len=256)
    host = validate.text("host", args.get("host") or "", max_len=256)
    privileged = validate.boolean("privileged", args.get("privileged"), True)
    privileged, user = run_as_account(args.get("user"), peer, privileged, accounts)
    forward_agent = validate.boolean("forward_agent", args.get("forward_agent"), False)
    if forward_agent and privileged:
        raise validate.bad(
            "forward_agent", "forward_agent is only allowed for unprivileged commands (privileged: false)"
        )
    env = validate.env_map("env", args.get("env"))
    protected = validate.env_map("protected_env", args.get("protected_env"))
    for name, value in protected.items():
        if not value:
            raise validate.bad(f"protected_env.{name}", "must not be empty")
    cwd = validate.optional_text("cwd", args.get("cwd"), max_len=4096)
    if cwd is not None and not cwd.startswith("/"):
        raise validate.bad("cwd", "must be an absolute path")
    ceiling = config.limits.max_output_bytes
    spec = ExecSpec(
        mode=mode,
        stages=stages,
        privileged=privileged,
        uid=peer.uid,
        env=env,
        protected_names=tuple(sorted(protected)),
        cwd=cwd,
        stdin=_stdin(args.get("stdin")),
        timeout_ms=validate.integer("timeout_ms", args.get("timeout_ms"), minimum=1, maximum=7 * 24 * 3600 * 1000),
        deadline_ms=validate.integer("deadline_ms", args.get("deadline_ms"), minimum=0),
        max_output_bytes=validate.integer("max_output_bytes", args.get("max_output_bytes"), minimum=1, maximum=ceiling),
        forward_agent=forward_agent,
        user=user,
    )
    operation_id = validate.optional_text("operation_id", args.get("operation_id"), max_len=128)
    if operation_id is not None and not operation_id:
        raise validate.bad("operation_id", "must not be empty")
    stream = validate.boolean("stream", args.get("stream"), False)
    when = parse_time(args.get("time"), config, now)
    # sudo's env_reset for every privileged job: root's, or another account's (issue 48).
    strict = spec.run_as == 0 or spec.privileged
    check_env("env", env, config, privileged=strict)
    check_env("protected_env", protected, config, privileged=strict)
    return ExecRequest(
        request_id=request_id,
        spec=spec,
        protected_env=protected,
        operation_id=operation_id,
        reason=reason,
        session=session,
        host=host,
        time=when,
        stream=stream,
        wait=validate.boolean("wait", args.get("wait"), True),
        join=validate.boolean("join", args.get("join"), False),
    )


def native_exec(
    request_id: str | None,
    args: dict[str, Any],
    peer: Peer,
    config: Config,
    now: float,
    accounts: Accounts | None = None,
) -> ExecRequest:
    unknown = sorted(set(args) - NATIVE_EXEC_FIELDS)
    if unknown:
        raise validate.bad(unknown[0], "unknown field", ErrorCode.INVALID_ARGUMENTS)
    rid = validate.request_id("id", request_id) if request_id is not None else str(uuid.uuid4())
    mode, stages = _stages_from_native(args)
    return _build(args, request_id=rid, stages=stages, mode=mode, peer=peer, config=config, now=now, accounts=accounts)


def legacy_id(obj: dict[str, Any]) -> str:
    """reference/000: the id defaults to a fresh UUIDv4."""
    value = obj.get("id")
    if value is None or value == "":
        return str(uuid.uuid4())
    return validate.request_id("id", value)


def legacy_exec(obj: dict[str, Any], peer: Peer, config: Config, now: float) -> ExecRequest:
    """A reference/000 exec request: the wire shape is always a list of stages."""
    rid = legacy_id(obj)
    stages = _pipeline(obj.get("pipeline"))
    args = {k: obj.get(k) for k in ("privileged", "env", "reason", "session", "host", "time", "forward_agent")}
    return _build(args, request_id=rid, stages=stages, mode="exec", peer=peer, config=config, now=now)
