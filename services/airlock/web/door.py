"""airlock-web's calls on operator.sock: one blocking client call per request, off the event loop.

Every call is bounded (``DOOR_TIMEOUT_SECONDS``) and its failure is a
`DoorError` with approval's error code and message (or ``unavailable`` when
the door cannot be reached), which the pages show as text; never a traceback.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from airlock.common import client
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb

A = TypeVar("A", bound=Message)

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

    def _call(self, verb: Verb[A, Any], args: A) -> dict[str, Any]:
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

    async def call(self, verb: Verb[A, Any], args: A) -> dict[str, Any]:
        """A declared operator verb (`wire.operator`, `wire.passkey`'s messages): its reply's data."""
        return await asyncio.to_thread(self._call, verb, args)


def decision_args(body: dict[str, Any]) -> dict[str, Any]:
    """A decision form's fields (pages.decide_form) as `wire.passkey.DecideBegin`'s keyword arguments."""
    args: dict[str, Any] = {"id": body.get("ref"), "decision": body.get("decision")}
    if body.get("expect"):  # what the page showed (pages.decide_form): approval checks it
        args["expect"] = body.get("expect")
    if body.get("reason"):
        args["reason"] = body.get("reason")
    grant = body.get("grant")
    if isinstance(grant, str) and grant:
        # The form's "SCOPE:SECONDS" (pages.decide_form) as approve's grant_seconds and scope.
        scope, _, seconds = grant.partition(":")
        args["grant_seconds"] = int(seconds) if seconds.isdigit() else seconds
        args["scope"] = scope
    return args
