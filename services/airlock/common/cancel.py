"""Cancelling an approved operation at the agent door until the runner has it: the one loop.

The runner registers a job a moment after approval, so a ``cancel`` that
comes in between finds nothing to stop yet.  The clients that cancel on an
agent's behalf (the gateway, the MCP server) ask again, every
``retry_seconds``, until it is cancelled, until there is nothing left to
cancel (``stop()``: the call settled), until an attempt says to give up, or
until ``budget_seconds`` have passed — every wait has a bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

# An attempt answers True (cancelled), False (not running yet: ask again) or None (give up).
Attempt = Callable[[], Awaitable[bool | None]]

DEFAULT_BUDGET_SECONDS = 300.0


async def cancel_until_running(
    attempt: Attempt,
    *,
    retry_seconds: float,
    stop: Callable[[], bool] = lambda: False,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
) -> bool:
    """Whether the operation was cancelled (see the module docstring)."""
    give_up = time.monotonic() + budget_seconds
    while not stop():
        answer = await attempt()
        if answer is True:
            return True
        if answer is None or time.monotonic() >= give_up:
            return False
        await asyncio.sleep(retry_seconds)
    return False
