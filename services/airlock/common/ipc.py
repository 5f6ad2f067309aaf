"""The asyncio client every airlock process uses to reach another's socket.

A request is one envelope line; the reply is zero or more event lines and one
final response.  Connections are kept and reused (the servers read request
after request on one connection), so the per-request path pays no connect and
no peer lookup.  A service that cannot be reached is reported with the
caller's chosen code (``audit_unavailable`` for the journal, and so on), so
every caller fails closed with an error that names what was missing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from airlock.common.codec import Event, Request, Response, decode_reply, encode_request
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.framing import NEED_DATA, FrameDecoder

EventHandler = Callable[[Event], Awaitable[None] | None]
# Replies may carry up to 16 MiB of output per stream, base64-encoded, twice.
MAX_REPLY_BYTES = 96 * 1024 * 1024
# A pooled connection idle longer than this is dropped rather than reused, well
# before the server's own idle cut-off (limits.read_timeout_seconds).
POOL_IDLE_SECONDS = 5.0
POOL_SIZE = 32
_ids = itertools.count(1)


class _Conn:
    __slots__ = ("decoder", "idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(MAX_REPLY_BYTES)
        self.idle_since = time.monotonic()

    def usable(self) -> bool:
        return (
            not self.reader.at_eof()
            and not self.writer.is_closing()
            and time.monotonic() - self.idle_since < POOL_IDLE_SECONDS
            and self.decoder.buffered == 0
        )

    def close(self) -> None:
        self.writer.close()


class Unreachable(AirlockError):
    """The other service could not be reached, or the connection failed before a reply.

    An `AirlockError` with the caller's chosen code, so callers that only fail
    closed need not care; ``cause`` keeps the OS error for callers that
    explain it (the MCP server says "is airlock running?").
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        details: dict[str, Any],
        cause: BaseException | None = None,
        *,
        maybe_done: bool = False,
    ) -> None:
        super().__init__(code, message, details)
        self.cause = cause
        # The server read the request and went away before answering: it may have done it.
        self.maybe_done = maybe_done


class _Stale(Exception):
    """A reused connection turned out closed before any reply byte came back."""


class Client:
    def __init__(self, path: Path | str, *, service: str, unavailable: ErrorCode, timeout: float | None = 30.0) -> None:
        self.path = Path(path)
        self.service = service
        self.unavailable = unavailable
        self.timeout = timeout
        self._idle: list[_Conn] = []
        self._sweep: asyncio.TimerHandle | None = None

    def malformed_reply(self, verb: str, why: str) -> Unreachable:
        """A well-framed reply whose data its declaration does not allow: the callee is at fault, not
        the caller's arguments, so fail closed as if it were down -- and it may have acted."""
        return self._down(f"malformed {verb} reply ({why})", maybe_done=True)

    def _down(self, why: str, cause: BaseException | None = None, *, maybe_done: bool = False) -> Unreachable:
        return Unreachable(
            self.unavailable,
            f"{self.service} is unavailable: {why}",
            {"service": self.service},
            cause,
            maybe_done=maybe_done,
        )

    async def call(
        self,
        verb: str,
        args: dict[str, Any],
        *,
        on_event: EventHandler | None = None,
        timeout: float | None = None,  # noqa: ASYNC109  per call: bounds the exchange and maps to unavailable
        token: str | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Send one request; return its ``data`` or raise its error as `AirlockError`."""
        deadline = timeout if timeout is not None else self.timeout
        try:
            # asyncio.timeout, not wait_for: wait_for wraps the call in a Task of its own, and every
            # internal call of every exec paid for that Task (issue 50); the bound is the same.
            async with asyncio.timeout(deadline):
                return await self._call(verb, args, on_event, token, request_id)
        except TimeoutError:
            raise self._down(f"no answer within {deadline:g}s") from None

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._idle:
            self._idle.pop().close()

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.path), limit=64 * 1024)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise self._down(os.strerror(exc.errno or 0) or type(exc).__name__, exc) from None
        except PermissionError as exc:
            raise self._down("permission denied on its socket", exc) from None
        except OSError as exc:
            raise self._down(exc.strerror or str(exc), exc) from None
        return _Conn(reader, writer)

    def _sweep_idle(self) -> None:
        """Close pooled connections that idled out or that the server closed.

        An idle connection is only looked at when taken; without this its fd
        would stay open after the server hung up, for as long as nobody calls.
        """
        self._sweep = None
        keep = []
        for conn in self._idle:
            if conn.usable():
                keep.append(conn)
            else:
                conn.close()
        self._idle = keep
        if keep:
            self._sweep = asyncio.get_running_loop().call_later(POOL_IDLE_SECONDS, self._sweep_idle)

    def _take(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    async def _call(
        self, verb: str, args: dict[str, Any], on_event: EventHandler | None, token: str | None, request_id: str | None
    ) -> dict[str, Any]:
        rid = request_id or f"{os.getpid()}-{next(_ids)}"
        line = encode_request(Request(id=rid, verb=verb, args=args, token=token))
        conn = self._take()
        if conn is not None:
            try:
                return await self._exchange(conn, line, on_event, reused=True)
            except _Stale:
                # The server closed this idle connection without reading our line
                # (a restart, an idle cut-off): nothing was done, so ask again.
                conn.close()
        return await self._exchange(await self._connect(), line, on_event, reused=False)

    async def _exchange(
        self, conn: _Conn, line: bytes, on_event: EventHandler | None, *, reused: bool
    ) -> dict[str, Any]:
        replied = False
        keep = False
        try:
            conn.writer.write(line)
            await conn.writer.drain()
            while True:
                try:
                    frame = conn.decoder.next_frame()
                except AirlockError as exc:
                    if exc.code is not ErrorCode.REQUEST_TOO_LARGE:
                        raise
                    # The server answered (it did the work) with more than we read: the
                    # caller must not take this for "nothing happened" (intake settles it).
                    raise Unreachable(
                        self.unavailable,
                        f"{self.service} replied with more than {conn.decoder.max_bytes} bytes",
                        {"service": self.service, "reply_too_large": True},
                        maybe_done=True,
                    ) from None
                if frame is NEED_DATA:
                    chunk = await conn.reader.read(256 * 1024)
                    if not chunk:
                        # A clean end of stream: the server took our line off its
                        # socket before it closed (a close with the line unread is a
                        # reset, below), so it may have acted on it -- journaled a
                        # record, decided, run a job.  Never asked again: a retry
                        # would do it twice (issue 20's lifecycle check caught
                        # duplicated records after a SIGKILL).
                        raise self._down("connection closed before the reply", maybe_done=True)
                    conn.decoder.feed(chunk)
                    continue
                assert isinstance(frame, bytes)
                replied = True
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
                keep = True
                if reply.ok:
                    assert reply.data is not None
                    return reply.data
                assert reply.error is not None
                raise reply.error
        except (ConnectionError, BrokenPipeError) as exc:
            # EPIPE on the write, or a reset on the read (Linux resets a Unix
            # stream whose peer closed with data unread): the line was not read.
            if reused and not replied:
                raise _Stale from None
            raise self._down(f"connection lost ({type(exc).__name__})", exc, maybe_done=replied) from None
        finally:
            if keep and len(self._idle) < POOL_SIZE:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
                if self._sweep is None:
                    self._sweep = asyncio.get_running_loop().call_later(POOL_IDLE_SECONDS, self._sweep_idle)
            elif not keep:
                conn.close()
