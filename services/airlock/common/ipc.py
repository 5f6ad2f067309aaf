"""The asyncio client every airlock process uses to reach another's socket.

One request per connection: connect, write one envelope, read event lines
until the final response.  A service that cannot be reached is reported with
the caller's chosen code (``audit_unavailable`` for the journal, and so on),
so every caller fails closed with an error that names what was missing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from airlock.common.codec import NEED_DATA, Event, FrameDecoder, Request, Response, decode_reply, encode_request
from airlock.common.errors import AirlockError, ErrorCode

EventHandler = Callable[[Event], Awaitable[None] | None]
# Replies may carry up to 16 MiB of output per stream, base64-encoded, twice.
MAX_REPLY_BYTES = 96 * 1024 * 1024
_ids = itertools.count(1)


class Client:
    def __init__(self, path: Path | str, *, service: str, unavailable: ErrorCode, timeout: float | None = 30.0) -> None:
        self.path = Path(path)
        self.service = service
        self.unavailable = unavailable
        self.timeout = timeout

    def _down(self, why: str) -> AirlockError:
        return AirlockError(self.unavailable, f"{self.service} is unavailable: {why}", {"service": self.service})

    async def call(
        self,
        verb: str,
        args: dict[str, Any],
        *,
        on_event: EventHandler | None = None,
        timeout: float | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        """Send one request; return its ``data`` or raise its error as `AirlockError`."""
        deadline = timeout if timeout is not None else self.timeout
        try:
            return await asyncio.wait_for(self._call(verb, args, on_event, token), deadline)
        except TimeoutError:
            raise self._down(f"no answer within {deadline:g}s") from None

    async def _call(self, verb: str, args: dict[str, Any], on_event: EventHandler | None, token: str | None) -> dict[str, Any]:
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.path), limit=64 * 1024)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise self._down(os.strerror(exc.errno or 0) or type(exc).__name__) from None
        except PermissionError:
            raise self._down("permission denied on its socket") from None
        except OSError as exc:
            raise self._down(exc.strerror or str(exc)) from None
        try:
            request = Request(id=f"{os.getpid()}-{next(_ids)}", verb=verb, args=args, token=token)
            writer.write(encode_request(request))
            await writer.drain()
            decoder = FrameDecoder(MAX_REPLY_BYTES)
            while True:
                frame = decoder.next_frame()
                if frame is NEED_DATA:
                    chunk = await reader.read(256 * 1024)
                    if not chunk:
                        raise self._down("connection closed before the reply")
                    decoder.feed(chunk)
                    continue
                assert isinstance(frame, bytes)
                try:
                    reply = decode_reply(frame)
                except AirlockError as exc:
                    raise self._down(f"malformed reply ({exc.message})") from None
                if isinstance(reply, Event):
                    if on_event is not None:
                        result = on_event(reply)
                        if result is not None:
                            await result
                    continue
                assert isinstance(reply, Response)
                if reply.ok:
                    assert reply.data is not None
                    return reply.data
                assert reply.error is not None
                raise reply.error
        except (ConnectionError, BrokenPipeError) as exc:
            raise self._down(f"connection lost ({type(exc).__name__})") from None
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, BrokenPipeError):
                pass
