"""Verb declarations: which verb each door serves, who may call it, what it carries.

A `Verb` declares one verb: its door, its name, who may call it, its argument
and reply messages.  `serve` builds a server's door table from a door's
declarations and refuses to build one that serves a verb not declared or
leaves a declared verb unserved; a `Stub` is how a caller calls a verb, so a
call is an import a reader, mypy and the layer test can follow.  The
messages a verb carries, and their one encoding, are `wire.message` (named
here too, so a declaration module imports one place).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airlock.common.errors import AirlockError, ErrorCode

# The messages are named here too: a declaration module imports its verbs' vocabulary from one place.
from airlock.common.wire.message import Empty as Empty
from airlock.common.wire.message import Message as Message
from airlock.common.wire.message import Open as Open
from airlock.common.wire.message import carry as carry

if typing.TYPE_CHECKING:
    from airlock.common.ipc import Client, EventHandler
    from airlock.common.peer import Peer
    from airlock.common.server import Call


class DoorName(enum.StrEnum):
    """The sockets that serve verbs (docs/architecture.md names each)."""

    JOURNAL = "journal"
    RUNNER = "runner"
    APPROVAL = "approval"  # approval's internal door (intake, runner)
    OPERATOR = "operator"  # operator.sock, served by approval
    AGENT = "agent"  # agent.sock, served by intake
    EXECTREE = "exectree"  # internal/exectree.sock, served by airlock-exectree (the runner's exec trees)


class Caller(enum.StrEnum):
    """Who may call a verb: a service by its account, or a person's role on a front door."""

    INTAKE = "intake"
    APPROVAL = "approval"
    RUNNER = "runner"
    OPERATOR = "operator"  # a person who may decide (root, operators.users/groups)
    OBSERVER = "observer"  # reads only (operators.observers, the relay, airlock-web)
    WEB = "web"  # airlock-web's account: observer, plus the passkey verbs
    AGENT = "agent"  # anyone the agent door admits


A = TypeVar("A", bound=Message)
R = TypeVar("R", bound=Message)


@dataclass(frozen=True)
class Verb(Generic[A, R]):
    """One verb, declared once: where it is served, who may call it, what it carries."""

    door: DoorName
    name: str
    callers: frozenset[Caller]
    args: type[A]
    reply: type[R]
    summary: str
    streams: bool = False  # event lines come before the reply (``events --follow``, ``logs``)

    def __hash__(self) -> int:
        return hash((self.door, self.name))


_DECLARED: dict[DoorName, dict[str, Verb[Any, Any]]] = {door: {} for door in DoorName}


def declare(
    door: DoorName,
    name: str,
    callers: frozenset[Caller] | set[Caller],
    args: type[A],
    reply: type[R],
    summary: str,
    *,
    streams: bool = False,
) -> Verb[A, R]:
    """Declare a verb (at import of its door's module); a name declared twice on one door is a bug."""
    if name in _DECLARED[door]:
        raise ValueError(f"verb {name!r} declared twice on door {door}")
    verb = Verb(door, name, frozenset(callers), args, reply, summary, streams)
    _DECLARED[door][name] = verb
    return verb


def declared(door: DoorName) -> Mapping[str, Verb[Any, Any]]:
    """The verbs declared on ``door`` so far (import its module first; `wire.registry` imports all)."""
    return types.MappingProxyType(_DECLARED[door])


Handler = Callable[["Call", A], Awaitable[R]]
Served = Callable[["Call"], Awaitable[dict[str, Any]]]


# Who a door's peer is, in the terms of `Verb.callers` (a door that knows sets it; see `serve`).
CallerOf = Callable[["Peer"], frozenset[Caller]]


# The refusal a caller the declaration does not name gets (a door may word it for its people).
Refusal = Callable[["Verb[Any, Any]"], AirlockError]


def _not_for_caller(verb: Verb[Any, Any]) -> AirlockError:
    return AirlockError(ErrorCode.UNAUTHORIZED, f"{verb.name} is not for this caller", {"verb": verb.name})


def _typed(verb: Verb[A, R], handler: Handler[A, R], caller_of: CallerOf | None, refuse: Refusal) -> Served:
    async def served(call: Call) -> dict[str, Any]:
        if caller_of is not None and not caller_of(call.peer) & verb.callers:
            raise refuse(verb)
        reply = await handler(call, verb.args.from_dict(call.args))
        return reply.to_dict()

    served.__name__ = served.__qualname__ = f"{verb.door}.{verb.name}"
    return served


def serve(
    door: DoorName,
    handlers: Mapping[Verb[Any, Any], Handler[Any, Any]],
    *,
    caller_of: CallerOf | None = None,
    refuse: Refusal = _not_for_caller,
) -> dict[str, Served]:
    """A door's verb table (`common.server.Door.verbs`), exactly its declared verbs.

    Raises ValueError at build time when a handler is for another door, or a
    declared verb has no handler: a service cannot serve what is not declared
    nor forget what is.  With ``caller_of`` (the peer's roles), a verb refuses
    a caller its declaration does not name (unauthorized) before its
    arguments are read: "who may call it" is enforced where it is declared
    (``refuse`` words that refusal).
    """
    table: dict[str, Served] = {}
    for verb, handler in handlers.items():
        if verb.door is not door or _DECLARED[door].get(verb.name) is not verb:
            raise ValueError(f"{verb.door}.{verb.name} is not declared on door {door}")
        table[verb.name] = _typed(verb, handler, caller_of, refuse)
    missing = set(_DECLARED[door]) - set(table)
    if missing:
        raise ValueError(f"door {door} does not serve declared verbs: {', '.join(sorted(missing))}")
    return table


def untyped(handler: Callable[[Call], Awaitable[dict[str, Any]]]) -> Handler[Open, Open]:
    """A front door's handler that checks its public arguments field by field itself (declared with `Open`)."""

    async def adapted(call: Call, args: Open) -> Open:
        return Open(await handler(call))

    return adapted


class Stub:
    """A caller's side of one door: ``await journal.call(APPEND, Append(...))`` returns an ``Appended``."""

    def __init__(self, door: DoorName, client: Client) -> None:
        self.door = door
        self.client = client

    async def call(
        self,
        verb: Verb[A, R],
        args: A,
        *,
        on_event: EventHandler | None = None,
        timeout: float | None = None,  # noqa: ASYNC109  passed to the client, which bounds the exchange
        request_id: str | None = None,
    ) -> R:
        if verb.door is not self.door:
            raise ValueError(f"{verb.door}.{verb.name} called through the {self.door} stub")
        data = await self.client.call(
            verb.name, args.to_dict(), on_event=on_event, timeout=timeout, request_id=request_id
        )
        try:
            return verb.reply.from_dict(data)
        except AirlockError as exc:  # the callee's fault: not invalid_arguments against the caller's client
            raise self.client.malformed_reply(verb.name, exc.message) from None

    def close(self) -> None:
        self.client.close()
