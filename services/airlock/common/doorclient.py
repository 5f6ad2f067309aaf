"""The asyncio client of a front door (agent.sock, operator.sock) for the clients that stay up: gateway, MCP.

One native v1 request at a time through `common.ipc.Client` (its pooled
connections, its framing), with a fresh UUID as the request ID unless the
caller gives one: the agent door refuses an ID it saw within its replay
window, and a counter could repeat after a restart.  The door's own errors
come back as the `AirlockError` they are; a door that cannot be used (no
socket, refused, gone mid-reply, a malformed reply) is `DoorUnavailable`,
with the OS error kept as ``cause`` for callers that explain it.

The `airlock` command has its own blocking client (`common.client`): it must
start quickly and never loads asyncio.  A door a service serves is
`common.server.Door`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from airlock.common.codec import Event
from airlock.common.errors import ErrorCode
from airlock.common.ipc import Client, Unreachable
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb

A = TypeVar("A", bound=Message)

OnEvent = Callable[[Event], Awaitable[None] | None]


class DoorUnavailable(Exception):
    """The door could not be reached, or the connection broke before the reply."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause


class DoorClient:
    def __init__(self, path: str, *, name: str = "airlock") -> None:
        self.path = path
        # INTERNAL is only the code of an Unreachable, turned into DoorUnavailable here.
        self._client = Client(path, service=name, unavailable=ErrorCode.INTERNAL, timeout=None)

    async def call(
        self, verb: Verb[A, Any], args: A, on_event: OnEvent | None = None, *, request_id: str | None = None
    ) -> dict[str, Any]:
        """One request of a declared verb; its ``data``, or the door's `AirlockError`, or `DoorUnavailable`."""
        rid = request_id or str(uuid.uuid4())
        try:
            return await self._client.call(verb.name, args.to_dict(), on_event=on_event, request_id=rid)
        except Unreachable as exc:
            raise DoorUnavailable(exc.message, exc.cause) from None

    def close(self) -> None:
        self._client.close()
