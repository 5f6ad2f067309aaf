"""airlock-web's calls on operator.sock: one blocking client call per request, off the event loop.

Every call is bounded (``DOOR_TIMEOUT_SECONDS``) and its failure is a
`DoorError` with approval's error code and message (or ``unavailable`` when
the door cannot be reached), which the pages show as text; never a traceback.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airlock.common import client

DOOR_TIMEOUT_SECONDS = 20.0


class DoorError(Exception):
    def __init__(self, code: str, message: str, reason: str = "") -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reason = reason  # details.reason: the precise code behind a reference-004 one (rate_limited, ...)


class Door:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    def _call(self, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            _raw, reply = client.call(self.socket_path, verb, args, timeout=DOOR_TIMEOUT_SECONDS)
        except (client.ClientError, OSError) as exc:
            raise DoorError("unavailable", str(exc)) from None
        if not reply.get("ok"):
            error = reply.get("error") or {}
            details = error.get("details")
            details = details if isinstance(details, dict) else {}
            raise DoorError(
                str(error.get("code") or "internal"),
                str(error.get("message") or "refused"),
                str(details.get("reason") or ""),
            )
        data = reply.get("data")
        return data if isinstance(data, dict) else {}

    async def call(self, verb: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self._call, verb, args or {})
