"""The gateway's use of the agent door (native v1, streaming), through `common.doorclient`.

Each call gets a fresh UUID as its native request ID: the agent door refuses
a request ID it saw within its replay window, and a per-process counter could
repeat after a restart with a recycled pid.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from airlock.common.codec import Event
from airlock.common.doorclient import DoorClient, DoorUnavailable
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb

__all__ = ["DoorUnavailable", "call"]

A = TypeVar("A", bound=Message)

OnEvent = Callable[[Event], Awaitable[None]]


async def call(path: str, verb: Verb[A, Any], args: A, on_event: OnEvent | None = None) -> dict[str, Any]:
    """One native request on a fresh connection; returns ``data`` or raises the door's `AirlockError`."""
    client = DoorClient(path, name="the agent door")
    try:
        return await client.call(verb, args, on_event=on_event, request_id=f"gw-{uuid.uuid4()}")
    except DoorUnavailable as exc:
        raise DoorUnavailable(f"cannot use the agent door at {path}: {exc.message}", exc.cause) from None
    finally:
        client.close()
