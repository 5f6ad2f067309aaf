"""The thin asyncio shell every airlock service runs in.

It serves the sockets handed over by activation, checks each peer with
SO_PEERCRED against the door's allow-list *before reading a byte*, moves
request lines between the socket and the codec, and dispatches verbs from a
small fixed table.  It owns the lifecycle: READY/STATUS/WATCHDOG/STOPPING
through sd_notify, idle exit when socket-activated (never with work in
flight), and on SIGTERM it stops accepting and lets in-flight work finish
within ``services.stop_timeout_seconds``.  What a door is (its table, one
connection's bounded reads and writes, one call) is `door.py`.

This is the only place that catches ``Exception``: anything unexpected becomes
an ``internal`` error for the peer and a logged event for the operator, and
the service goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from airlock.common import log
from airlock.common.codec import (
    Request,
    encode_error,
    encode_ok,
    parse_object,
    recover_id,
    request_from_object,
)
from airlock.common.config import Config
from airlock.common.door import CLIENT_DOORS, Call, Connection, ConnectionHandler, Door, Guard, Verb, write_timeout
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.notify import Notifier
from airlock.common.peer import credentials, peer_of

# What a door is (and a connection, a call) lives in door.py; callers keep importing it from here.
__all__ = [
    "CLIENT_DOORS",
    "ROOT_IS_NO_AGENT",
    "Call",
    "Connection",
    "ConnectionHandler",
    "Door",
    "Guard",
    "Service",
    "Verb",
    "linger",
    "write_timeout",
]

ROOT_IS_NO_AGENT = (
    "root is not an agent here (agents.users and agents.groups decide who asks, and root "
    "needs no gateway); run the agent as its own user (e.g. runuser -u deploy -- airlock run ...), "
    "or decide requests as an operator: airlock pending"
)


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
