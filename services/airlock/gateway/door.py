"""The gateway's use of the agent door (native v1, streaming), through `common.ipc.Client`.

Each call gets a fresh UUID as its native request ID: the agent door refuses
a request ID it saw within its replay window, and a per-process counter could
repeat after a restart with a recycled pid.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from airlock.common.codec import Event
from airlock.common.errors import ErrorCode
from airlock.common.ipc import Client, Unreachable

OnEvent = Callable[[Event], Awaitable[None]]


class DoorUnavailable(Exception):
    """The agent door could not be reached, or the connection broke before the reply."""


async def call(path: str, verb: str, args: dict[str, Any], on_event: OnEvent | None = None) -> dict[str, Any]:
    """One native request; returns ``data`` or raises the door's `AirlockError`."""
    # INTERNAL is only the code of the Unreachable raised here; the door's own
    # errors pass through as they are.
    client = Client(path, service="the agent door", unavailable=ErrorCode.INTERNAL, timeout=None)
    try:
        return await client.call(verb, args, on_event=on_event, request_id=f"gw-{uuid.uuid4()}")
    except Unreachable as exc:
        raise DoorUnavailable(f"cannot use the agent door at {path}: {exc.message}") from None
    finally:
        client.close()
