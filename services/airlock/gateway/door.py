"""The gateway's asyncio client of the agent door (native v1, streaming).

Like `common/ipc.Client`, but the caller chooses the native request ID: the
agent door refuses a request ID it saw within its replay window, so each call
gets a fresh UUID rather than a per-process counter that a restarted gateway
(with a recycled pid) could repeat.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from airlock.common.codec import NEED_DATA, Event, FrameDecoder, Request, Response, decode_reply, encode_request
from airlock.common.errors import AirlockError

OnEvent = Callable[[Event], Awaitable[None]]
MAX_REPLY_BYTES = 96 * 1024 * 1024


class DoorUnavailable(Exception):
    """The agent door could not be reached, or the connection broke before the reply."""


async def call(path: str, verb: str, args: dict[str, Any], on_event: OnEvent | None = None) -> dict[str, Any]:
    """One native request; returns ``data`` or raises the door's `AirlockError`."""
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=64 * 1024)
    except OSError as exc:
        raise DoorUnavailable(f"cannot reach the agent door at {path}: {exc.strerror or exc}") from None
    try:
        request = Request(id=f"gw-{uuid.uuid4()}", verb=verb, args=args)
        writer.write(encode_request(request))
        await writer.drain()
        decoder = FrameDecoder(MAX_REPLY_BYTES)
        while True:
            frame = decoder.next_frame()
            if frame is NEED_DATA:
                chunk = await reader.read(256 * 1024)
                if not chunk:
                    raise DoorUnavailable("the agent door closed the connection before replying")
                decoder.feed(chunk)
                continue
            assert isinstance(frame, bytes)
            try:
                reply = decode_reply(frame)
            except AirlockError as exc:
                raise DoorUnavailable(f"the agent door sent a malformed reply ({exc.message})") from None
            if isinstance(reply, Event):
                if on_event is not None:
                    await on_event(reply)
                continue
            assert isinstance(reply, Response)
            if reply.ok:
                assert reply.data is not None
                return reply.data
            assert reply.error is not None
            raise reply.error
    except (ConnectionError, BrokenPipeError) as exc:
        raise DoorUnavailable(f"lost the connection to the agent door ({type(exc).__name__})") from None
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, BrokenPipeError):
            pass
