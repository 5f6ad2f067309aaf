"""One door a service serves: its verb table and guards, one connection on it, one call.

A `Door` is a socket with its allow-list, its verbs and its limits; a
`Connection` is one accepted peer on it, read a line at a time under per-read,
whole-line and handshake deadlines and written under a write deadline (a peer
that does not take its bytes is dropped); a `Call` is one request being
served, what a verb handler receives.  The service shell that accepts and
dispatches is `server.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import select
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airlock.common.codec import Request, encode_error, encode_event
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.framing import NEED_DATA, FrameDecoder
from airlock.common.peer import AllowList, Peer

# The doors clients use.  The others are service-to-service: their peers read
# actively, but intake may be relaying an event to a slow agent (bounded by the
# agent door's own timeout) while approval or the runner writes to it, so an
# internal door allows twice the timeout plus a margin: a slow agent never
# cuts an internal connection first.
CLIENT_DOORS = frozenset({"agent", "operator"})


def write_timeout(config: Config, door: Door) -> float:
    """How long one write to a client of ``door`` may take before it is disconnected."""
    seconds = config.limits.write_timeout_seconds
    return seconds if door.name in CLIENT_DOORS else 2 * seconds + 30


class Connection:
    """One accepted client: its peer, and helpers to read lines and write replies."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer, door: Door, config: Config
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self.door = door
        self.decoder = FrameDecoder(door.max_line)
        self._read_timeout = config.limits.read_timeout_seconds
        self._request_timeout = config.limits.request_timeout_seconds
        # A client door's first request must be whole within read_timeout_seconds of
        # connecting, however its bytes are paced (sudo-proxy's HANDSHAKE_DEADLINE):
        # a silent or trickling client gets an error line, not a silent close.
        self._handshake_deadline = time.monotonic() + self._read_timeout if door.name in CLIENT_DOORS else None
        self._write_timeout = write_timeout(config, door)
        self.closed_by_peer = False
        # Waiting for the next request after a whole one (not a first line): a stop ends it at once.
        self.between_requests = False
        # Set when the server gave up on this client (it did not take its bytes in time).
        self.dropped: str | None = None
        self.on_dropped: Callable[[Connection, str], None] | None = None

    async def read_line(self) -> bytes | None:
        """The next request line, or None on a clean EOF between requests.

        Raises `AirlockError` for an over-long line, a line without its
        newline, or a client too slow to send one (per-read and whole-line
        deadlines, so a slow drip cannot hold a slot for ever; on a client
        door the first line has one wall-clock deadline from connecting).
        """
        started = time.monotonic()
        handshake = self._handshake_deadline
        while True:
            frame = self.decoder.next_frame()
            if frame is not NEED_DATA:
                assert isinstance(frame, bytes)
                self._handshake_deadline = None  # later lines: the per-read and whole-line deadlines
                return frame
            now = time.monotonic()
            if handshake is not None:
                budget = handshake - now
            elif self.decoder.buffered:
                budget = min(self._read_timeout, self._request_timeout - (now - started))
            else:
                budget = self._read_timeout
            if budget <= 0:
                raise self._too_slow(handshake)
            self.between_requests = handshake is None and not self.decoder.buffered
            try:
                # A timeout scope, not wait_for (a Task per read): the same bound, without a Task (issue 50).
                async with asyncio.timeout(budget):
                    chunk = await self.reader.read(64 * 1024)
            except TimeoutError:
                if handshake is None and not self.decoder.buffered:
                    return None  # an idle client between requests: just close
                raise self._too_slow(handshake) from None
            except ConnectionError:
                self.closed_by_peer = True
                return None
            finally:
                self.between_requests = False
            if not chunk:
                self.closed_by_peer = True
                self.decoder.end_of_stream()
                return None
            self.decoder.feed(chunk)

    def end_if_idle(self) -> None:
        """On stop: a client waiting between requests (a pooled connection) is no work in flight.

        Waited for, it held a stop until limits.read_timeout_seconds, and two
        services holding each other's pooled connections each waited that long
        (issue 36's slow teardowns).  Our reading side is shut: bytes the
        client already sent are still read (and answered), then the end of
        stream ends the connection; a later write of the client's fails
        (EPIPE), which `ipc.Client` takes for a closed pooled connection and
        asks again on a new one.
        """
        if self.between_requests:
            with contextlib.suppress(OSError):
                self.writer.get_extra_info("socket").shutdown(socket.SHUT_RD)

    def _too_slow(self, handshake: float | None) -> AirlockError:
        if handshake is not None:
            # sudo-proxy's words ("handshake deadline exceeded"), with airlock's detail.
            return AirlockError(
                ErrorCode.READ_TIMEOUT,
                f"handshake deadline exceeded: no complete request line within {self._read_timeout:g}s "
                "of connecting (limits.read_timeout_seconds)",
            )
        return AirlockError(ErrorCode.READ_TIMEOUT, "request not received in time")

    async def send(self, data: bytes) -> None:
        """Write one reply line; a client that does not take it within
        ``limits.write_timeout_seconds`` is disconnected (`ConnectionResetError`)."""
        if self.dropped is not None:
            raise ConnectionResetError(f"connection dropped: {self.dropped}")
        self.writer.write(data)
        try:
            async with asyncio.timeout(self._write_timeout):  # not wait_for: no Task per reply (issue 50)
                await self.writer.drain()
        except TimeoutError:
            self.drop("write_timeout")
            raise ConnectionResetError("the client did not read its reply in time") from None

    def drop(self, reason: str) -> None:
        """Give up on this client now: the socket is closed, unsent bytes are discarded."""
        if self.dropped is not None:
            return
        self.dropped = reason
        if self.on_dropped is not None:
            self.on_dropped(self, reason)
        self.writer.transport.abort()

    def peer_gone(self) -> bool:
        """Whether the client has closed its end completely (or was dropped).

        For a Unix stream socket the kernel reports POLLHUP only once the peer
        closed both directions: a client that shut down only its writing side
        after sending its request (as some reference/000 clients do) still
        waits for its answer, and is not gone.
        """
        if self.dropped is not None or self.writer.is_closing():
            return True
        sock = self.writer.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, 0)  # POLLHUP, POLLERR and POLLNVAL are always reported
        return bool(poller.poll(0))

    async def wait_gone(self, interval: float = 0.25) -> None:
        """Return once the client has gone (see `peer_gone`); cancel it to stop watching."""
        while not self.peer_gone():  # noqa: ASYNC110  nothing signals a peer's hang-up: it is polled
            await asyncio.sleep(interval)


@dataclass
class Call:
    """One request being served: what a verb handler receives."""

    request: Request
    peer: Peer
    connection: Connection
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def args(self) -> dict[str, Any]:
        return self.request.args

    async def emit(self, event: str, fields: dict[str, Any]) -> None:
        """Write an event line before the final response (streaming verbs)."""
        with contextlib.suppress(ConnectionError):
            await self.connection.send(encode_event(self.request.id, event, next(self._seq), fields))


Verb = Callable[[Call], Awaitable[dict[str, Any]]]
ConnectionHandler = Callable[[Connection], Awaitable[None]]
# A door's own check of every request before its verb is looked up: raises to
# refuse, or returns the request to serve (intake's token check and refusal of
# operator verbs).
Guard = Callable[[Request, "Connection"], Awaitable[Request]]


@dataclass
class Door:
    """One socket a service serves, with who may use it and what it offers."""

    name: str
    allow: AllowList
    verbs: Mapping[str, Verb] = field(default_factory=dict)
    max_line: int = 1024 * 1024
    max_connections: int | None = None
    # At most this many connections per peer uid (one agent cannot starve the others).
    max_per_peer: int | None = None
    # A door with its own dialect (intake's agent door) replaces the native loop;
    # its native requests still go through `Service.dispatch` and this table.
    handler: ConnectionHandler | None = None
    guard: Guard | None = None
    # How a refusal made before the request is read (busy, unauthorized) is written.
    refusal: Callable[[AirlockError], bytes] = lambda exc: encode_error(None, exc)
    # Errors as this door reports them (the operator door keeps to reference/004's list).
    errors: Callable[[AirlockError], AirlockError] = lambda exc: exc
    active: int = 0
    by_peer: Counter[int] = field(default_factory=Counter)
