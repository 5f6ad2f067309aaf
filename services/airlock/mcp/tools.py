"""The MCP tools airlock offers: their descriptions, argument checks and the status text.

Pure: no I/O; the shell (`airlock.mcp.server`) turns a checked call into a
request on the agent door and hands the reply to `mcp/render` to be shown.  Results
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

# Versions at which the tool listing gained fields (older clients get none of them).
_ANNOTATIONS_SINCE: Final = "2025-03-26"
_TITLE_SINCE: Final = "2025-06-18"

KiB: Final = 1024
# Output shown per stream (stdout, each stage's stderr): the default keeps a
# result a small part of a model's context (64 KiB of text is some 16,000
# tokens; Claude Code refuses a tool result over 25,000 tokens unless
# MAX_MCP_OUTPUT_TOKENS says otherwise); a call may ask for up to the maximum.
OUTPUT_DEFAULT: Final = 64 * KiB
OUTPUT_MAX: Final = 1024 * KiB
# What the runner captures per stream (the agent door's max_output_bytes): more
# than is shown, so the size and sha256 of most outputs are known whole, and far
# less than airlock's 16 MiB default, which would only be thrown away here.
CAPTURE_BYTES: Final = 4 * 1024 * KiB
# The encoded text of one result at most: official clients reject a line over
# 10 MiB (the TypeScript SDK's ReadBuffer) and close the session; a pipeline
# with many stages is shown with smaller per-stream caps until it fits.
RESULT_BUDGET: Final = 4 * 1024 * KiB
# A request is journaled whole, and an audit record holds at most 64 KiB of
# JSON.  The largest record is `approval.pending` (what the operator is asked
# about): it carries argv three times (the request, its display, its argument
# classification), stdin twice as base64, env and cwd twice.  So the arguments
# are bounded up front, each by its own name, with all of them at their limits
# still fitting (about 59 KiB); airlock's own refusal of a larger record is
# translated to name the arguments (`render_refusal`).
STDIN_MAX: Final = 8 * KiB
COMMAND_MAX: Final = 8 * KiB
ENV_MAX: Final = 4 * KiB
REASON_MAX: Final = 1024
CWD_MAX: Final = 1024


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

Result: each stage's exit code, stdout, each stage's stderr, whether the command timed \
out, and the airlock operation id. A non-zero exit code is a normal result (the command \
ran), not a tool error. Every call runs the command again; nothing is cached.

Large output: each stream shows at most max_output_bytes (64 KiB by default, up to 1 MiB); \
a note gives the full size and sha256 of what was cut. airlock keeps no copy of the output, \
so prefer commands that print what you need (head, tail, grep, journalctl -n) over raising \
the limit. Binary output is not shown (pipe it through base64 or xxd if you need it).

Limits (airlock records every request whole): stdin at most 8 KiB; argv, pipeline or command \
at most 8 KiB in all; env at most 4 KiB; reason and cwd at most 1024 characters. For more \
input, have the command read a file."""

_ARGV_SCHEMA: Final = {
    "type": "array",
    "items": {"type": "string", "maxLength": COMMAND_MAX},
    "minItems": 1,
    "maxItems": 4096,
}

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
                "maxItems": 64,
                "description": "Stages joined by pipes (stdout of one to stdin of the next), run without a shell.",
            },
            "command": {
                "type": "string",
                "maxLength": COMMAND_MAX,
                "description": "A shell command line, run by /bin/sh -c.",
            },
            "privileged": {
                "type": "boolean",
                "default": True,
                "description": "Run as root (default). false runs it as your own user, which policy may approve "
                "more easily.",
            },
            "user": {
                "type": "string",
                "maxLength": 64,
                "description": "Run it as this account instead of root (sudo -u): a name such as postgres; the "
                "policy must allow that account (a rule's run_as), else an operator decides.",
            },
            "reason": {
                "type": "string",
                "maxLength": REASON_MAX,
                "description": "Why you need this, in one sentence. Shown to the operator who approves it and kept "
                "in the audit journal.",
            },
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Environment variables to set. Only names allowed by airlock's env.allow list are "
                "accepted; "
                "a privileged run never takes HOME, USER, LOGNAME, SHELL, PATH or loader/interpreter variables "
                "(LD_*, PYTHON*, ...). At most 4 KiB of names and values in all.",
            },
            "cwd": {
                "type": "string",
                "maxLength": CWD_MAX,
                "description": "Absolute working directory (default: / for root, else your home).",
            },
            "stdin": {
                "type": "string",
                "maxLength": STDIN_MAX,
                "description": "Text fed to the first stage's standard input (default: none). At most 8 KiB "
                "(8192 bytes of UTF-8); for more, have the command read a file.",
            },
            "timeout": {
                "type": "integer",
                "minimum": 1,
                "description": "Kill the command after this many milliseconds (default: airlock's "
                "limits.default_timeout_seconds). Does not include time waiting for approval.",
            },
            "max_output_bytes": {
                "type": "integer",
                "minimum": 1,
                "maximum": OUTPUT_MAX,
                "default": OUTPUT_DEFAULT,
                "description": "Show at most this many bytes of each output stream (stdout, each stderr); the "
                "rest is cut, with a note giving its size and sha256. Default 65536 (64 KiB), at most 1048576.",
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


def _utf8_size(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _at_most(name: str, size: int, limit: int, unit: str = "bytes") -> None:
    if size > limit:
        raise ArgumentError(f"{name}: is {size} {unit}; the limit is {limit} {unit}")


def output_limit(untrusted: Mapping[str, Any]) -> int:
    """`max_output_bytes`: how much of each stream the result shows."""
    value = untrusted.get("max_output_bytes")
    if value is None:
        return OUTPUT_DEFAULT
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise ArgumentError(f"max_output_bytes: must be a whole number of bytes, 1 to {OUTPUT_MAX}")
    if not 1 <= value <= OUTPUT_MAX:
        raise ArgumentError(f"max_output_bytes: must be 1 to {OUTPUT_MAX} (got {int(value)})")
    return int(value)


def _command_form(untrusted: Mapping[str, Any], form: str) -> dict[str, Any]:
    """The one of argv, pipeline or command that was given, checked and sized."""
    args: dict[str, Any] = {}
    if form == "argv":
        args["argv"] = _string_list("argv", untrusted["argv"])
        if len(args["argv"]) > 4096:
            raise ArgumentError("argv: has more than 4096 items")
        _at_most("argv", sum(_utf8_size(a) + 1 for a in args["argv"]), COMMAND_MAX)
    elif form == "pipeline":
        pipeline = untrusted["pipeline"]
        if not isinstance(pipeline, list) or not pipeline:
            raise ArgumentError("pipeline: must be a non-empty list of argv lists")
        if len(pipeline) > 64:
            raise ArgumentError("pipeline: has more than 64 stages")
        args["pipeline"] = [_string_list(f"pipeline[{i}]", stage) for i, stage in enumerate(pipeline)]
        _at_most("pipeline", sum(_utf8_size(a) + 1 for stage in args["pipeline"] for a in stage), COMMAND_MAX)
    else:
        command = untrusted["command"]
        if not isinstance(command, str) or not command.strip():
            raise ArgumentError("command: must be a non-empty string")
        _at_most("command", _utf8_size(command), COMMAND_MAX)
        args["command"] = command
    return args


def exec_args(
    untrusted: Mapping[str, Any], *, now: str, operation_id: str, session: str | None = None
) -> dict[str, Any]:
    """Check `execute`'s arguments and build the agent door's native `exec` args.

    Shapes and the sizes stated in the schema are checked here, each refusal
    naming the argument the model sent; airlock itself validates every value
    (and its refusal names the field), so the two never disagree on what is allowed.
    """
    unknown = sorted(set(untrusted) - _EXEC_KEYS)
    if unknown:
        raise ArgumentError(f"unknown argument {unknown[0]!r} (known: {', '.join(sorted(_EXEC_KEYS))})")
    given = [key for key in ("argv", "pipeline", "command") if untrusted.get(key) is not None]
    if len(given) != 1:
        raise ArgumentError(
            "give exactly one of argv, pipeline or command" + (f" (got {' and '.join(given)})" if given else "")
        )
    output_limit(untrusted)
    # The runner captures more than is shown (sizes and digests of most output
    # known whole), never airlock's 16 MiB default per stream.
    args: dict[str, Any] = {
        "time": now,
        "operation_id": operation_id,
        "stream": True,
        "max_output_bytes": CAPTURE_BYTES,
    }
    args |= _command_form(untrusted, given[0])
    privileged = untrusted.get("privileged", True)
    if not isinstance(privileged, bool):
        raise ArgumentError("privileged: must be true or false")
    args["privileged"] = privileged
    for key, limit in (("reason", REASON_MAX), ("cwd", CWD_MAX), ("user", 64)):
        value = untrusted.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ArgumentError(f"{key}: must be a string")
            _at_most(key, len(value), limit, "characters")
            args[key] = value
    env = untrusted.get("env")
    if env is not None:
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ArgumentError("env: must be an object of string values")
        _at_most("env", sum(_utf8_size(k) + _utf8_size(v) + 2 for k, v in env.items()), ENV_MAX)
        args["env"] = dict(env)
    stdin = untrusted.get("stdin")
    if stdin is not None:
        if not isinstance(stdin, str):
            raise ArgumentError("stdin: must be a string")
        raw = stdin.encode("utf-8", "surrogatepass")
        _at_most("stdin", len(raw), STDIN_MAX)
        args["stdin"] = base64.b64encode(raw).decode()
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


def status_args(untrusted: Mapping[str, Any]) -> None:
    """`status` takes no arguments (its schema forbids extra properties)."""
    if untrusted:
        raise ArgumentError(f"unknown argument {sorted(untrusted)[0]!r} (status takes no arguments)")


def argument_error(exc: ArgumentError, tool: str = "execute") -> ToolResult:
    return ToolResult(f"NOT RUN: invalid arguments for {tool}: {exc}. Fix the arguments and call again.", is_error=True)


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
