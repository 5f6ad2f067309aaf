"""Declarations of the agent door (agent.sock, served by intake): the native verbs an agent may call.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use a `wire.verb.Stub` with them.

Every verb here is `Open`: its arguments are the public shape
docs/protocol.md documents, checked field by field in intake
(`intake.request`, `intake.fileop_request`) with the error an agent's client
expects; its reply is the documented public shape.  The order of declaration
is the order ``hello`` lists the verbs in.
"""

from __future__ import annotations

from typing import Final

from airlock.common.fileop_spec import FILE_TOOLS
from airlock.common.wire.verb import Caller, DoorName, Open, Verb, declare, declared

DOOR = DoorName.AGENT
AGENTS: Final = frozenset({Caller.AGENT})

EXEC = declare(DOOR, "exec", AGENTS, Open, Open, "run a command or pipeline, once policy or an operator allows it")
PING = declare(DOOR, "ping", AGENTS, Open, Open, "liveness (with a time: the gates exec passes)")
HELLO = declare(DOOR, "hello", AGENTS, Open, Open, "name, version, protocol versions, verbs, dialects")
CANCEL = declare(DOOR, "cancel", AGENTS, Open, Open, "withdraw a pending request or stop a running one (its own)")
FILES: Final[tuple[Verb[Open, Open], ...]] = tuple(
    declare(DOOR, name, AGENTS, Open, Open, f"the file operation {name} (docs/protocol.md, File operations)")
    for name in sorted(FILE_TOOLS)
)
APPROVE_SIGNED = declare(DOOR, "approve_signed", AGENTS, Open, Open, "carry an operator's signed decision")
CAN = declare(DOOR, "can", AGENTS, Open, Open, "what the policy would do with an exec request; nothing runs")

# Derived from the declarations above (never a copy), in ``hello``'s order.
VERBS: Final = tuple(declared(DOOR))
# The verbs whose work runs in a session (policy matches it): a token's session replaces theirs.
SESSION_VERBS: Final = frozenset(v.name for v in (EXEC, CAN, *FILES))
