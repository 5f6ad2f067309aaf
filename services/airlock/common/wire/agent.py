"""Declarations of the agent door (agent.sock, served by intake): the native verbs an agent may call.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers name these verbs and build these messages.

The arguments are `Public` messages: the public shapes docs/protocol.md
documents, key for key, each typed where its type says all (a string, a
boolean).  A field whose check is the request's own (argv and pipeline
stages, env maps, stdin's base64, a file tool's parameters, the time's
freshness) is carried as it came and checked by intake's own parsers
(`intake.request`, `intake.fileop_request`, `common.fileop_spec`), which
name the element at fault (``pipeline[0][1]``, ``env.NAME``).  exec, can,
approve_signed and the file operations refuse a key they do not declare;
ping and hello ignore one (reference/000's control actions).  The order of
declaration is the order ``hello`` lists the verbs in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from airlock.common import validate
from airlock.common.fileop_spec import FILE_TOOLS, tool_params
from airlock.common.wire import approval as wire_approval
from airlock.common.wire.message import Document, Public
from airlock.common.wire.verb import Caller, DoorName, Verb, declare, declared

DOOR = DoorName.AGENT
AGENTS: Final = frozenset({Caller.AGENT})

TEXT_MAX = 4096
SIGNATURE_MAX = 16 * 1024


def _texts(message: Any, *names: str) -> None:
    for name in names:
        validate.optional_text(name, getattr(message, name), max_len=TEXT_MAX)


@dataclass(frozen=True)
class Control(Public):
    """``ping`` and ``hello``: with a ``time``, checked for freshness and their ``id`` for replay."""

    session: str | None = None
    host: str | None = None
    reason: str | None = None
    time: Any = None  # intake.request.parse_time checks it (format, freshness), naming the field

    def check(self) -> None:
        _texts(self, "session", "host", "reason")


@dataclass(frozen=True)
class Exec(Public):
    """``exec`` (and ``can``): a command or pipeline, as protocol.md's *exec* documents it."""

    strict: ClassVar[bool] = True

    pipeline: Any = None  # stages of argv: intake.request checks each, naming pipeline[i][j]
    argv: Any = None  # one stage: validate.argv
    command: str | None = None  # a shell command line (its own mode)
    privileged: bool | None = None
    env: Any = None  # NAME -> value: validate.env_map names env.NAME
    protected_env: Any = None
    cwd: str | None = None
    stdin: Any = None  # base64 of the bytes: intake.request checks it
    timeout_ms: Any = None  # bounds are the settings' (limits.*): intake.request checks them
    deadline_ms: Any = None
    max_output_bytes: Any = None
    operation_id: str | None = None
    reason: str | None = None
    session: str | None = None
    host: str | None = None
    time: Any = None  # intake.request.parse_time
    forward_agent: bool | None = None
    stream: bool | None = None
    wait: bool | None = None  # False (an agent's `sudo -n`): approval_required rather than ask a person
    join: bool | None = None  # join the same request already pending (issue 48: sudo's retry)
    user: str | None = None  # run as this account (intake.request.run_as_account checks it)


@dataclass(frozen=True)
class Cancel(Public):
    operation_id: str

    def check(self) -> None:
        validate.text("operation_id", self.operation_id, max_len=256, allow_empty=False)


@dataclass(frozen=True)
class ApproveSigned(Public):
    """Carry an operator's signature over this agent's own pending request (no ``principal``: see protocol.md)."""

    strict: ClassVar[bool] = True

    request_id: str
    signature: Any = None  # armoured: checked below in the words agents have always been answered
    reason: str | None = None

    def check(self) -> None:
        s = self.signature
        if not isinstance(s, str) or not s or len(s) > SIGNATURE_MAX:
            raise validate.bad("signature", "must be an armoured SSH signature (at most 16 KiB)")
        validate.request_id("request_id", self.request_id)
        _texts(self, "reason")


# The envelope every file operation carries beside its tool's parameters (intake.fileop_request).
_FILE_ENVELOPE: Final = (
    ("path", Any),  # common.fileop_spec.check_path: absolute, no . or ..
    ("privileged", bool | None),
    ("operation_id", str | None),
    ("reason", str | None),
    ("session", str | None),
    ("host", str | None),
    ("time", Any),
)


def _file_message(tool: str) -> type[Public]:
    """A file operation's arguments: the envelope and the tool's parameters (common.fileop_spec checks them)."""
    fields = [(name, hint, dataclasses.field(default=None)) for name, hint in _FILE_ENVELOPE]
    fields += [(name, Any, dataclasses.field(default=None)) for name in tool_params(tool)]
    name = "".join(part.title() for part in tool.split("_"))
    made = dataclasses.make_dataclass(name, fields, bases=(Public,), frozen=True, namespace={"strict": True})
    made.__module__ = __name__
    made.__doc__ = f"``{tool}``: the path, the envelope, and {tool}'s parameters (docs/protocol.md, File operations)."
    return made


FILE_ARGS: Final = {tool: _file_message(tool) for tool in sorted(FILE_TOOLS)}


# --- replies ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pong(Public):
    message: str
    version: str


@dataclass(frozen=True)
class Hello(Public):
    name: str
    version: str
    protocol_versions: tuple[int, ...]
    verbs: tuple[str, ...]
    dialects: tuple[str, ...]
    env_allow: tuple[str, ...]  # what an agent's `sudo -E` may carry (env.allow)
    retry_window_seconds: float  # how long a retry joins its pending request (agents.retry_window_seconds)


@dataclass(frozen=True)
class Cancelled(Public):
    operation_id: str
    cancelling: bool
    was: str | None = None  # "pending" (withdrawn); the runner's answer for a running one says only cancelling


class Evidence(Document):
    """``exec`` and the file operations: the evidence of a run (protocol.md, *exec* and *File operations*)."""


EXEC = declare(DOOR, "exec", AGENTS, Exec, Evidence, "run a command or pipeline, once policy or an operator allows it")
PING = declare(DOOR, "ping", AGENTS, Control, Pong, "liveness (with a time: the gates exec passes)")
HELLO = declare(DOOR, "hello", AGENTS, Control, Hello, "name, version, protocol versions, verbs, dialects")
CANCEL = declare(
    DOOR, "cancel", AGENTS, Cancel, Cancelled, "withdraw a pending request or stop a running one (its own)"
)
FILES: Final[tuple[Verb[Any, Evidence], ...]] = tuple(
    declare(
        DOOR, tool, AGENTS, FILE_ARGS[tool], Evidence, f"the file operation {tool} (docs/protocol.md, File operations)"
    )
    for tool in sorted(FILE_TOOLS)
)
APPROVE_SIGNED = declare(
    DOOR, "approve_signed", AGENTS, ApproveSigned, wire_approval.SignedVote, "carry an operator's signed decision"
)
CAN = declare(
    DOOR, "can", AGENTS, Exec, wire_approval.Explained, "what the policy would do with an exec request; nothing runs"
)

FILE_VERBS: Final = {verb.name: verb for verb in FILES}  # a file tool's verb by its name (the gateway's tools)
FILES_READ: Final = FILE_VERBS["files_read"]  # the ones called by name (`airlock sudoedit`)
FILES_WRITE: Final = FILE_VERBS["files_write"]

# Derived from the declarations above (never a copy), in ``hello``'s order.
VERBS: Final = tuple(declared(DOOR))
# The verbs whose work runs in a session (policy matches it): a token's session replaces theirs.
_IN_SESSION: tuple[Verb[Any, Any], ...] = (EXEC, CAN, *FILES)
SESSION_VERBS: Final = frozenset(v.name for v in _IN_SESSION)
