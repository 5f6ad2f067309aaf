"""The MCP tools airlock offers: their descriptions, argument checks and result texts.

No I/O here: the shell (`airlock.mcp.server`) turns a checked call into a
request on the agent door and hands the reply back to be rendered.  Results
are plain text written for a model to read; `is_error` is set only when the
command did not run (denied, not approved in time, an airlock error), never
for a command that ran and exited non-zero.

Adding a tool (the file tools of issue 10): describe it here with a
`ToolSpec` and list it in `BUILTIN`, check its arguments with a function like
`exec_args`, and give the server a handler of the same name
(`server.AgentDoor.handlers`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

# Versions at which the tool listing gained fields (older clients get none of them).
_ANNOTATIONS_SINCE: Final = "2025-03-26"
_TITLE_SINCE: Final = "2025-06-18"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self, protocol_version: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": dict(self.input_schema),
        }
        # Protocol versions are dates, so they compare as strings.
        if protocol_version >= _TITLE_SINCE:
            out["title"] = self.title
        if self.annotations and protocol_version >= _ANNOTATIONS_SINCE:
            out["annotations"] = dict(self.annotations) | (
                {"title": self.title} if protocol_version < _TITLE_SINCE else {}
            )
        return out


@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str
    is_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": self.text}], "isError": self.is_error}


class ArgumentError(Exception):
    """A tool argument is wrong; the message names it (shown to the model as a tool error)."""


# --- execute ----------------------------------------------------------------------

EXECUTE_DESCRIPTION: Final = """\
Run a command on this machine through airlock: a gateway that runs it (as root by \
default) once a policy rule or a human operator approves it, and records it in a \
tamper-evident audit journal.

When to use it: for anything that needs root (systemctl, apt, editing files under /etc, \
reading protected logs, managing users, mounts, firewalls...) or that the operator wants \
audited. Use your own shell for ordinary unprivileged work in your workspace.

How to give the command - exactly one of:
- argv: one program and its arguments, no shell (preferred), e.g. ["systemctl", "restart", "nginx"]
- pipeline: several argv lists joined by pipes, no shell, e.g. [["journalctl", "-u", "nginx", "-n", "200"], ["grep",
"error"]]
- command: a string run by /bin/sh -c, only when you need shell syntax (redirection, &&, globbing)

Approval: many commands are decided at once by policy, but some wait for a human \
operator to approve them. That can take up to the approval timeout (60 seconds by \
default, approval.timeout_seconds). The call stays open while it waits and reports \
progress: waiting is not a failure, and do not send the command again meanwhile. Always \
give a specific `reason`: the operator reads it when deciding.

Denials: if a policy rule or an operator denies the command, the result says DENIED and \
names the rule (or the operator). The command did not run. Do not retry it, or a reworded \
variant meant to get around the rule; change approach or ask the user.

Result: each stage's exit code, stdout, each stage's stderr, whether output was truncated \
or the command timed out, and the airlock operation id. A non-zero exit code is a normal \
result (the command ran), not a tool error. Every call runs the command again; nothing is \
cached."""

_ARGV_SCHEMA: Final = {"type": "array", "items": {"type": "string"}, "minItems": 1}

EXECUTE: Final = ToolSpec(
    name="execute",
    title="Run a command through airlock (approved and audited)",
    description=EXECUTE_DESCRIPTION,
    input_schema={
        "type": "object",
        "properties": {
            "argv": _ARGV_SCHEMA
            | {"description": "One program and its arguments, run without a shell. The program is looked up in PATH."},
            "pipeline": {
                "type": "array",
                "items": _ARGV_SCHEMA,
                "minItems": 1,
                "description": "Stages joined by pipes (stdout of one to stdin of the next), run without a shell.",
            },
            "command": {"type": "string", "description": "A shell command line, run by /bin/sh -c."},
            "privileged": {
                "type": "boolean",
                "default": True,
                "description": "Run as root (default). false runs it as your own user, which policy may approve "
                "more easily.",
            },
            "reason": {
                "type": "string",
                "description": "Why you need this, in one sentence. Shown to the operator who approves it and kept "
                "in the audit journal.",
            },
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Environment variables to set. Only names allowed by airlock's env.allow list are "
                "accepted; "
                "a privileged run never takes HOME, USER, LOGNAME, SHELL, PATH or loader/interpreter variables "
                "(LD_*, PYTHON*, ...).",
            },
            "cwd": {
                "type": "string",
                "description": "Absolute working directory (default: / for root, else your home).",
            },
            "stdin": {"type": "string", "description": "Text fed to the first stage's standard input (default: none)."},
            "timeout": {
                "type": "integer",
                "minimum": 1,
                "description": "Kill the command after this many milliseconds (default: airlock's "
                "limits.default_timeout_seconds). Does not include time waiting for approval.",
            },
        },
        "additionalProperties": False,
    },
    annotations={"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": False},
)

_EXEC_KEYS: Final = frozenset(EXECUTE.input_schema["properties"])


def _string_list(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ArgumentError(f"{name}: must be a non-empty list of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ArgumentError(f"{name}[{i}]: must be a string")
    if not value[0]:
        raise ArgumentError(f"{name}[0]: the program name must not be empty")
    return list(value)


def exec_args(
    untrusted: Mapping[str, Any], *, now: str, operation_id: str, session: str | None = None
) -> dict[str, Any]:
    """Check `execute`'s arguments and build the agent door's native `exec` args.

    Only shapes are checked here; airlock itself validates every value (and its
    refusal names the field), so the two can never disagree on what is allowed.
    """
    unknown = sorted(set(untrusted) - _EXEC_KEYS)
    if unknown:
        raise ArgumentError(f"unknown argument {unknown[0]!r} (known: {', '.join(sorted(_EXEC_KEYS))})")
    given = [key for key in ("argv", "pipeline", "command") if untrusted.get(key) is not None]
    if len(given) != 1:
        raise ArgumentError(
            "give exactly one of argv, pipeline or command" + (f" (got {' and '.join(given)})" if given else "")
        )
    args: dict[str, Any] = {"time": now, "operation_id": operation_id, "stream": True}
    if "argv" in given:
        args["argv"] = _string_list("argv", untrusted["argv"])
    elif "pipeline" in given:
        pipeline = untrusted["pipeline"]
        if not isinstance(pipeline, list) or not pipeline:
            raise ArgumentError("pipeline: must be a non-empty list of argv lists")
        args["pipeline"] = [_string_list(f"pipeline[{i}]", stage) for i, stage in enumerate(pipeline)]
    else:
        command = untrusted["command"]
        if not isinstance(command, str) or not command.strip():
            raise ArgumentError("command: must be a non-empty string")
        args["command"] = command
    privileged = untrusted.get("privileged", True)
    if not isinstance(privileged, bool):
        raise ArgumentError("privileged: must be true or false")
    args["privileged"] = privileged
    for key in ("reason", "cwd"):
        value = untrusted.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ArgumentError(f"{key}: must be a string")
            args[key] = value
    env = untrusted.get("env")
    if env is not None:
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ArgumentError("env: must be an object of string values")
        args["env"] = dict(env)
    stdin = untrusted.get("stdin")
    if stdin is not None:
        if not isinstance(stdin, str):
            raise ArgumentError("stdin: must be a string")
        args["stdin"] = base64.b64encode(stdin.encode("utf-8", "surrogatepass")).decode()
    timeout = untrusted.get("timeout")
    if timeout is not None:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or (isinstance(timeout, float) and not timeout.is_integer())
            or timeout < 1
        ):
            raise ArgumentError("timeout: must be a whole number of milliseconds, at least 1")
        args["timeout_ms"] = int(timeout)
    if session:
        args["session"] = session
    return args


def argument_error(exc: ArgumentError) -> ToolResult:
    return ToolResult(
        f"NOT RUN: invalid arguments for execute: {exc}. Fix the arguments and call again.", is_error=True
    )


# --- rendering what airlock answered ----------------------------------------------


def _decode(data: Any) -> tuple[str, bool]:
    """Base64 output to text; the flag says whether it was valid UTF-8."""
    if not isinstance(data, str) or not data:
        return "", True
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "[airlock sent output that is not base64]", False
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), False


def _shown(argv: Any) -> str:
    if not isinstance(argv, list):
        return "?"
    text = " ".join(str(a) for a in argv)
    return text if len(text) <= 80 else text[:77] + "..."


def _stage_status(stage: Mapping[str, Any]) -> str:
    signal = stage.get("signal")
    if isinstance(signal, int) and stage.get("exit_code") is None:
        return f"killed by signal {signal}"
    code = stage.get("exit_code")
    return f"exit code {code}" if isinstance(code, int) else "no exit code"


def _section(title: str, data: Any, truncated: bool) -> list[str]:
    text, utf8 = _decode(data)
    notes = []
    if truncated:
        notes.append("TRUNCATED by airlock's output cap")
    if not utf8:
        notes.append("not valid UTF-8; undecodable bytes shown as U+FFFD")
    head = f"--- {title}" + (f" ({'; '.join(notes)})" if notes else "") + " ---"
    return [head, text.rstrip("\n") if text else "(empty)"]


def _decision(decision: Any) -> str:
    if not isinstance(decision, dict):
        return ""
    rule, by = decision.get("rule"), decision.get("decided_by")
    if by in (None, "policy"):
        return f"allowed by policy rule {rule!r}" if rule else "allowed by policy"
    return f"approved by operator {by}" + (f" (rule {rule!r})" if rule else "")


def render_evidence(data: Mapping[str, Any]) -> ToolResult:
    """The evidence of a command that ran, whatever its exit code."""
    stages = [s for s in data.get("stages") or [] if isinstance(s, dict)]
    last = stages[-1] if stages else {}
    lines: list[str] = []
    if data.get("cancelled"):
        lines.append(f"The command was CANCELLED before it finished ({_stage_status(last)}).")
    elif data.get("timed_out"):
        reason = data.get("timeout_reason")
        lines.append(f"The command TIMED OUT{f' ({reason})' if reason else ''} and was killed ({_stage_status(last)}).")
    else:
        lines.append(f"The command ran: {_stage_status(last)}.")
    if len(stages) > 1:
        parts = [f"stage {i} ({_shown(s.get('argv'))}): {_stage_status(s)}" for i, s in enumerate(stages, 1)]
        lines.append("Pipeline: " + "; ".join(parts) + ".")
    facts = [f"operation {data.get('operation_id')}"]
    if isinstance(data.get("uid"), int):
        facts.append(f"ran as uid {data['uid']}" + (f" in {data['cwd']}" if data.get("cwd") else ""))
    if isinstance(data.get("duration_ms"), int):
        facts.append(f"{data['duration_ms']} ms")
    decided = _decision(data.get("decision"))
    if decided:
        facts.append(decided)
    lines.append("; ".join(facts) + ".")
    if data.get("replay"):
        lines.append("This is the recorded outcome of an earlier run of the same operation; it did not run again.")
    if data.get("output_retained") is False:
        lines.append("Its output was too large to keep for replay; only exit codes are known.")
    lines.append("")
    lines += _section("stdout", data.get("stdout"), bool(data.get("stdout_truncated")))
    for i, stage in enumerate(stages, 1):
        title = "stderr" if len(stages) == 1 else f"stderr of stage {i} ({_shown(stage.get('argv'))})"
        lines += _section(title, stage.get("stderr"), bool(stage.get("stderr_truncated")))
    return ToolResult("\n".join(lines))


def render_refusal(code: str, message: str, details: Mapping[str, Any]) -> ToolResult:
    """A request that did not run: denied, not approved in time, or refused by airlock."""
    rule = details.get("rule")
    by = details.get("decided_by")
    if code == "command_not_found" or (code == "denied" and rule == "unresolved" and by in (None, "policy")):
        # Not a judgement on the command: airlock could not find the program.
        return ToolResult(
            "NOT RUN: airlock could not find the program (policy rule 'unresolved' refuses a command whose "
            "binary cannot be resolved in the target user's PATH, or a relative path). Check the program name "
            "or give its absolute path.",
            is_error=True,
        )
    if code == "denied":
        who = (
            f"policy rule {rule!r}"
            if by in (None, "policy")
            else f"operator {by}" + (f" (rule {rule!r})" if rule else "")
        )
        # airlock's message is "denied by <who>[: <reason>]": keep only what it adds.
        said = message.partition(": ")[2] if message.startswith("denied by") else message
        return ToolResult(
            f"DENIED by {who}{': ' + said if said else ''}. The command did not run. Do not retry it, or a variant "
            "meant to get around the denial; take another approach, or tell the user what you need and why.",
            is_error=True,
        )
    if code == "approval_timeout":
        return ToolResult(
            f"NOT RUN: no operator approved it in time ({message}"
            + (f"; rule {rule!r} asks an operator" if rule else "")
            + "). Nobody denied it either; the operator may be away. Tell the user the command needs an "
            "operator's approval (while it waits they see it with `airlock pending` and approve it with "
            "`airlock approve ID`), and call again only when they are ready to approve it.",
            is_error=True,
        )
    field = details.get("field")
    hint = {
        "invalid_arguments": "Fix the named field and call again.",
        "privilege_unavailable": "Run it with privileged: false, or ask the user to run airlock as root.",
        "busy": "airlock is busy; wait a little and try again.",
        "spawn_failed": "Check the program name and path.",
        "binary_changed": "The program changed on disk since it was approved; it did not run. Ask again if the "
        "change is expected.",
        "unsafe_binary": "A privileged run needs a program that only root can change; use a system binary or ask "
        "the user.",
        "unauthorized": "This user may not use airlock; ask the user to check the `agents` setting.",
        "approval_interrupted": "The approval service restarted while the command waited; it did not run. You may "
        "try again.",
    }.get(code, "The command did not run.")
    where = f" (field {field})" if isinstance(field, str) else ""
    return ToolResult(f"NOT RUN: airlock refused the request: {code}{where}: {message}. {hint}", is_error=True)


def unreachable(path: str, why: str) -> ToolResult:
    return ToolResult(
        f"NOT RUN: airlock is not reachable at {path}: {why}. Ask the user to check `systemctl status airlock.socket` "
        "(or that `airlock mcp --socket` points at the right socket).",
        is_error=True,
    )


# --- status -----------------------------------------------------------------------

STATUS: Final = ToolSpec(
    name="status",
    title="Is airlock reachable, on hold, how much is pending",
    description=(
        "Check airlock before or after using execute: whether airlock is reachable, its version, whether an "
        "operator has put it on hold (then every command waits for a human), and how many requests are waiting "
        "for approval. Hold state and the pending count need access to the operator socket; without it they are "
        "reported as unknown. Cheap and read-only: nothing runs."
    ),
    input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    annotations={"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
)


def render_status(
    agent_path: str,
    hello: Mapping[str, Any] | None,
    agent_problem: str | None,
    operator_path: str | None,
    operator: Mapping[str, Any] | None,
    operator_problem: str | None,
) -> ToolResult:
    if hello is None:
        return ToolResult(
            f"airlock is NOT reachable at {agent_path}: {agent_problem}. execute will not work until it is."
        )
    lines = [f"airlock is reachable at {agent_path} (airlock {hello.get('version')}, native protocol v1)."]
    if operator is not None:
        if operator.get("hold"):
            lines.append(f"Hold: ON ({operator.get('hold_reason')}): every command waits for an operator.")
        else:
            lines.append("Hold: off (policy decides as usual).")
        lines.append(f"Pending approvals: {operator.get('pending')}.")
        policy = operator.get("policy")
        if isinstance(policy, dict):
            lines.append(f"Policy: default {policy.get('default')}, {policy.get('rules')} rule(s).")
    else:
        where = f" at {operator_path}" if operator_path else ""
        lines.append(
            f"Hold state and pending approvals: unknown (operator socket{where} not usable: {operator_problem})."
        )
    return ToolResult("\n".join(lines))


BUILTIN: Final = (EXECUTE, STATUS)
