"""The thin asyncio shell every airlock service runs in.

It serves the sockets handed over by activation, checks each peer with
SO_PEERCRED against the door's allow-list *before reading a byte*, moves
request lines between the socket and the codec, and dispatches verbs from a
small fixed table.  It owns the lifecycle: READY/STATUS/WATCHDOG/STOPPING
through sd_notify, idle exit when socket-activated (never with work in
flight), and on SIGTERM it stops accepting and lets in-flight work finish
within ``services.stop_timeout_seconds``.

This is the only place that catches ``Exception``: anything unexpected becomes
an ``internal`` error for the peer and a logged event for the operator, and
the service goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import select
import signal
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airlock.common import log
from airlock.common.codec import (
    Request,
    encode_error,
    encode_event,
    encode_ok,
    parse_object,
    recover_id,
    request_from_object,
)
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.framing import NEED_DATA, FrameDecoder
from airlock.common.notify import Notifier
from airlock.common.peer import AllowList, Peer, credentials, peer_of

# The doors clients use.  The others are service-to-service: their peers read
# actively, but intake may be relaying an event to a slow agent (bounded by the
# agent door's own timeout) while approval or the runner writes to it, so an
# internal door allows twice the timeout plus a margin: a slow agent never
# cuts an internal connection first.
CLIENT_DOORS = frozenset({"agent", "operator"})
ROOT_IS_NO_AGENT = (
    "root is not an agent here (agents.users and agents.groups decide who asks, and root "
    "needs no gateway); run the agent as its own user (e.g. runuser -u deploy -- airlock run ...), "
    "or decide requests as an operator: airlock pending"
)


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
                chunk = await asyncio.wait_for(self.reader.read(64 * 1024), budget)
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
            await asyncio.wait_for(self.writer.drain(), self._write_timeout)
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


class Service:
    def __init__(self, name: str, config: Config, doors: list[Door]) -> None:
        self.name = name
        self.config = config
        self.doors = {door.name: door for door in doors}
        self.log = log.get()
        self.notifier = Notifier()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._idle_since = time.monotonic()
        self._servers: list[asyncio.Server] = []
        self._connections: set[Connection] = set()
        self.on_reload: Callable[[], Awaitable[None]] | None = None
        self.on_started: Callable[[], Awaitable[None]] | None = None  # serving: e.g. journal service.started
        self.on_stopping: Callable[[], None] | None = None  # stop begins: fail what cannot finish
        self.on_stop: Callable[[], Awaitable[None]] | None = None  # in-flight work is done
        # A client was disconnected by the server (it did not read its reply in time): journal it.
        self.on_dropped: Callable[[Connection, str], Awaitable[None]] | None = None
        # State an idle exit would lose (approval's session tokens) keeps the service up.
        self.keep_alive: Callable[[], bool] = lambda: False

    # --- lifecycle -----------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self.log.info(f"{self.name}.service.stopping", reason=reason)
            self._stop.set()

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def serve(self, sockets: Mapping[str, socket.socket], *, activated: bool = True) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self.request_stop, "SIGINT")
        if self.on_reload is not None:
            reload = self.on_reload
            loop.add_signal_handler(signal.SIGHUP, self._reload, reload)
        for name, door in self.doors.items():
            server = await asyncio.start_unix_server(
                functools.partial(self._accept, door=door), sock=sockets[name], limit=door.max_line + 1
            )
            self._servers.append(server)
        self.notifier.ready(f"serving {', '.join(sorted(self.doors))}")
        self.log.info(f"{self.name}.service.started", sockets=sorted(self.doors), pid=os.getpid())
        housekeeping = asyncio.create_task(self._housekeeping(activated))
        if self.on_started is not None:
            self._spawn(self.on_started())
        await self._stop.wait()
        housekeeping.cancel()
        self.notifier.stopping()
        if self.on_stopping is not None:
            self.on_stopping()
        # Stop accepting; the listening sockets stay open (systemd owns them)
        # and queued connections wait for the next instance.
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.end_if_idle()
        if self._tasks:
            self.notifier.status(f"finishing {len(self._tasks)} in-flight request(s)")
            _done, pending = await asyncio.wait(set(self._tasks), timeout=self.config.services.stop_timeout_seconds)
            for task in pending:
                task.cancel()
        if self.on_stop is not None:
            try:
                await asyncio.wait_for(self.on_stop(), 5)
            except (TimeoutError, AirlockError) as exc:
                self.log.warning(f"{self.name}.stop.incomplete", error=repr(exc))
        self.log.info(f"{self.name}.service.stopped")

    async def _housekeeping(self, activated: bool) -> None:
        watchdog = self.notifier.watchdog_interval()
        idle_after = self.config.services.idle_exit_seconds
        tick = min(x for x in (watchdog, 1.0) if x)
        while True:
            await asyncio.sleep(tick)
            if watchdog:
                self.notifier.watchdog()
            if self._tasks or self.keep_alive():
                self._idle_since = time.monotonic()
                continue
            if activated and idle_after > 0 and time.monotonic() - self._idle_since >= idle_after:
                self.request_stop("idle")
                return

    def _reload(self, reload: Callable[[], Awaitable[None]]) -> None:
        self._spawn(reload())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._idle_since = time.monotonic()
        if not task.cancelled() and task.exception() is not None:
            self.log.error(f"{self.name}.task.crashed", error=repr(task.exception()))

    # --- connections ---------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, door: Door) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._connection(reader, writer, door)
        finally:
            self._tasks.discard(task)
            self._idle_since = time.monotonic()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, door: Door) -> None:
        sock = writer.get_extra_info("socket")
        try:
            # The kernel's (pid, uid, gid) first: the caps cost no name lookup, so a
            # flood is turned away before it can use what lookups need (issue 28).
            creds = credentials(sock)
        except OSError:
            writer.close()
            return
        uid = creds[1]
        door.active += 1
        door.by_peer[uid] += 1
        try:
            if door.max_connections is not None and door.active > door.max_connections:
                await _send_quietly(
                    writer,
                    door.refusal(
                        door.errors(
                            AirlockError(ErrorCode.BUSY, "server busy: too many requests in flight; retry shortly")
                        )
                    ),
                )
                return
            if door.max_per_peer is not None and door.by_peer[uid] > door.max_per_peer:
                self.log.info(f"{self.name}.peer.capped", door=door.name, peer_uid=uid, limit=door.max_per_peer)
                await _send_quietly(
                    writer,
                    door.refusal(
                        door.errors(
                            AirlockError(
                                ErrorCode.BUSY,
                                "server busy: too many requests in flight from this user; retry shortly",
                            )
                        )
                    ),
                )
                return
            try:
                peer = peer_of(sock, creds)
            except AirlockError as exc:
                # A lookup that failed says nothing about who this is: not `unauthorized`.
                self.log.warning(f"{self.name}.peer.unidentified", door=door.name, peer_uid=uid, code=exc.code.value)
                await _send_quietly(writer, door.refusal(door.errors(exc)))
                await linger(reader, writer)
                return
            if not door.allow.allows(peer):
                self.log.warning(f"{self.name}.peer.refused", door=door.name, peer_uid=peer.uid, peer_pid=peer.pid)
                # One word for everyone (a probe learns nothing), except root, who is no prober
                # and is refused by design: say why and what to do instead (issue 32).
                why = ROOT_IS_NO_AGENT if peer.uid == 0 and door.name == "agent" else "unauthorized"
                await _send_quietly(writer, door.refusal(AirlockError(ErrorCode.UNAUTHORIZED, why)))
                await linger(reader, writer)
                return
            conn = Connection(reader, writer, peer, door, self.config)
            conn.on_dropped = self._dropped
            self._connections.add(conn)
            try:
                if door.handler is not None:
                    await door.handler(conn)
                else:
                    await self._native(conn)
            finally:
                self._connections.discard(conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # the one place that may catch anything
            self.log.exception(f"{self.name}.connection.failed", door=door.name, error=repr(exc))
        finally:
            door.active -= 1
            door.by_peer[uid] -= 1
            if door.by_peer[uid] <= 0:
                del door.by_peer[uid]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _dropped(self, conn: Connection, reason: str) -> None:
        self.log.warning(
            f"{self.name}.connection.dropped",
            door=conn.door.name,
            reason=reason,
            peer_uid=conn.peer.uid,
            peer_pid=conn.peer.pid,
            write_timeout_seconds=write_timeout(self.config, conn.door),
        )
        if self.on_dropped is not None:
            self._spawn(self.on_dropped(conn, reason))

    async def _native(self, conn: Connection) -> None:
        """Native v1: request lines in, one final response each, until EOF."""
        while not self._stop.is_set():
            try:
                line = await conn.read_line()
            except AirlockError as exc:
                # The stream cannot be resynchronised after a framing error.
                await _send_quietly(conn.writer, encode_error(None, conn.door.errors(exc)))
                await linger(conn.reader, conn.writer, budget=16 * 1024 * 1024, seconds=5.0)
                return
            if line is None:
                return
            await conn.send(await self.dispatch(conn, line))

    async def dispatch(
        self, conn: Connection, line: bytes, *, request: Request | None = None, obj: dict[str, Any] | None = None
    ) -> bytes:
        """Serve one native request line (or its parsed ``obj``); always returns exactly one final response."""
        request_id: str | None = None
        try:
            if request is None:
                obj = parse_object(line) if obj is None else obj
                request_id = recover_id(obj)
                request = request_from_object(obj)
            request_id = request.id
            if conn.door.guard is not None:
                request = await conn.door.guard(request, conn)
            verb = conn.door.verbs.get(request.verb)
            if verb is None:
                raise AirlockError(
                    ErrorCode.UNKNOWN_VERB,
                    f"unknown verb {request.verb!r}",
                    {"verbs": sorted(conn.door.verbs)},
                )
            data = await verb(Call(request, conn.peer, conn))
            return encode_ok(request_id, data)
        except AirlockError as exc:
            return encode_error(request_id, conn.door.errors(exc))
        except Exception as exc:  # the service shell turns surprises into `internal`
            self.log.exception(f"{self.name}.request.failed", request_id=request_id, error=repr(exc))
            return encode_error(request_id, AirlockError(ErrorCode.INTERNAL, "internal error; see the service log"))


async def _send_quietly(writer: asyncio.StreamWriter, data: bytes, timeout: float = 10.0) -> None:  # noqa: ASYNC109  a write bound, reported as a cut-off
    """Write a short refusal; a client that does not take it in ``timeout`` is cut off."""
    with contextlib.suppress(ConnectionError):
        writer.write(data)
        try:
            await asyncio.wait_for(writer.drain(), timeout)
        except TimeoutError:
            writer.transport.abort()


async def linger(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, budget: int = 1024 * 1024, seconds: float = 1.0
) -> None:
    """After a refusal, discard what the peer already sent (briefly, boundedly).

    Closing a socket with unread bytes makes the kernel send a reset, and a
    client that wrote its request first would lose the refusal it is owed.
    """
    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
        deadline = time.monotonic() + seconds
        while budget > 0 and (left := deadline - time.monotonic()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(64 * 1024), left)
            except TimeoutError:
                return
            if not chunk:
                return
            budget -= len(chunk)
