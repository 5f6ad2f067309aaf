"""`airlock gateway --stdio`: reference/001 on stdin/stdout, airlock behind it.

A thin asyncio shell: a reader thread hands stdin bytes to the loop, requests
are parsed by `gateway.protocol`, work is forwarded to the agent door
(`gateway.door`), and frames from the protocol module are written to stdout.
Every command still goes through intake, approval, runner and the journal;
the gateway adds no authority (it is just another agent-door client, running
as its own user).  Replay, conflict and in-progress answers come from the
journal through the door, so they survive a restart of the gateway.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from airlock.common import log
from airlock.common.cancel import cancel_until_running
from airlock.common.codec import Event, iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.wire import agent as agent_door
from airlock.gateway import door, evidence, fileop_execute
from airlock.gateway import params as params_of
from airlock.gateway import protocol as p

_CANCEL_RETRY_SECONDS = 0.05


@dataclass
class _Active:
    """One operation in flight (its ID is known from the door's ``accepted``)."""

    request_id: p.RequestId
    operation_id: str | None = None
    cancel_requested: bool = False
    cancel_task: asyncio.Task[None] | None = None


@dataclass
class Settings:
    socket: str
    privileged: bool = False
    cwd: str | None = None


@dataclass
class Gateway:
    settings: Settings
    write: Callable[[bytes], Awaitable[None]]
    telemetry: params_of.Telemetry = field(default_factory=params_of.Telemetry)
    shutting_down: bool = False
    _active: list[_Active] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.log = log.get()

    # --- dispatch -------------------------------------------------------------------

    async def handle_line(self, line: bytes) -> None:
        try:
            request = p.parse_request(line)
        except p.GatewayError as exc:
            self.log.info("gateway.request.malformed", code=exc.code)
            await self.write(p.encode_error(exc.request_id, exc))
            return
        if request.method in ("process.exec", "filesystem.execute", "cancel"):
            # Long-running work runs beside the reader, so cancel and health
            # are answered while a job runs.
            task = asyncio.create_task(self._guarded(request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        await self._guarded(request)

    async def _guarded(self, request: p.Request) -> None:
        try:
            result = await self._dispatch(request)
        except p.GatewayError as exc:
            await self.write(p.encode_error(request.id, exc))
            return
        except AirlockError as exc:
            await self.write(p.encode_error(request.id, p.from_native(exc)))
            return
        except door.DoorUnavailable as exc:
            await self.write(p.encode_error(request.id, p.GatewayError(p.Code.UNAVAILABLE, str(exc))))
            return
        except Exception as exc:  # the shell's last line of defence for one request
            self.log.exception("gateway.request.failed", request_id=request.id, error=repr(exc))
            await self.write(
                p.encode_error(request.id, p.GatewayError(p.Code.INTERNAL, "internal error; see the gateway log"))
            )
            return
        if result is not None:
            await self.write(p.encode_result(request.id, result))

    async def _dispatch(self, request: p.Request) -> dict[str, Any] | None:
        method, params = request.method, request.params
        if method == "hello":
            return p.hello()
        if method == "health":
            return p.health(self.active_ids(), shutting_down=self.shutting_down)
        if method == "telemetry.configure":
            self.telemetry = params_of.parse_telemetry(params)
            self.log.info(
                "gateway.telemetry.configured",
                enabled=self.telemetry.enabled,
                headers_configured=bool(self.telemetry.headers),
            )
            return self.telemetry.status()
        if method == "process.exec":
            return await self.process_exec(request)
        if method == "filesystem.execute":
            return await self.filesystem_execute(request)
        if method == "cancel":
            return await self.cancel(params_of.parse_operation_id(params))
        if method == "shutdown":
            self.shutting_down = True
            self.log.info("gateway.shutdown.requested", active=len(self._active))
            return {"shuttingDown": True, "activeOperations": self.active_ids()}
        raise p.GatewayError(p.Code.UNKNOWN_METHOD, f"unknown method {method!r}", {"methods": list(p.METHODS)})

    def active_ids(self) -> list[str]:
        return [a.operation_id for a in self._active if a.operation_id is not None]

    async def drain(self) -> None:
        """Let every operation in flight finish (shutdown, or EOF on stdin)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    # --- process.exec ---------------------------------------------------------------

    async def process_exec(self, request: p.Request) -> dict[str, Any] | None:
        params = params_of.parse_exec(request.params)
        if params.trace is not None:
            # Transport context only: logged (journald fields under systemd), never
            # forwarded to the child, never part of the operation ID.
            self.log.info(
                "gateway.trace.received", request_id=request.id, method=request.method, **params.trace.log_fields()
            )
        args = params.to_native(privileged=self.settings.privileged, default_cwd=self.settings.cwd, time=iso_utc())
        active = _Active(request.id, params.operation_id)
        output = evidence.OutputStream(params.max_output_bytes)
        accepted = False

        async def send_event(name: str, fields: dict[str, Any]) -> None:
            frame = p.encode_event(name, request.id, {"operationId": active.operation_id} | fields)
            if frame is not None:
                await self.write(frame)

        async def on_event(event: Event) -> None:
            nonlocal accepted
            f = event.fields
            if event.event == "accepted":
                active.operation_id = str(f.get("operation_id"))
                accepted = True
                await self.write(p.encode_accepted(request.id, active.operation_id))
            elif event.event in ("stdout", "stderr"):
                for fields in output.feed(event.event, f.get("data")):
                    await send_event("process.stream", fields)
                if output.overflowed:
                    self._start_cancel(active, reason="max_output_bytes")
            elif event.event == "pending_approval":
                await send_event(
                    "approval.pending", {"rule": f.get("rule"), "timeoutSeconds": f.get("timeout_seconds")}
                )
            elif event.event == "approved" and active.cancel_requested:
                self._start_cancel(active, reason="cancel")

        self._active.append(active)
        try:
            native = await door.call(self.settings.socket, agent_door.EXEC, agent_door.Exec(**args), on_event=on_event)
        finally:
            self._active.remove(active)
            if active.cancel_task is not None:
                active.cancel_task.cancel()
        for fields in output.flush():
            await send_event("process.stream", fields)
        active.operation_id = str(native.get("operation_id"))
        if not accepted:  # a replay: the door answered from the journal at once
            await self.write(p.encode_accepted(request.id, active.operation_id, {"replayed": True}))
        result = evidence.terminal(native, params, overflowed=output.overflowed)
        self.log.info(
            "gateway.process.finished",
            request_id=request.id,
            operation_id=active.operation_id,
            exit_code=result["exitCode"],
            replayed=result["replayed"],
        )
        await send_event("process.terminal", result)
        return result

    async def filesystem_execute(self, request: p.Request) -> dict[str, Any] | None:
        params = fileop_execute.parse(request.params)
        if params.trace is not None:
            self.log.info(
                "gateway.trace.received", request_id=request.id, method=request.method, **params.trace.log_fields()
            )
        active = _Active(request.id, params.operation_id)
        self._active.append(active)
        try:
            native = params.to_native(privileged=self.settings.privileged, time=iso_utc())
            outcome = await door.call(
                self.settings.socket, agent_door.FILE_VERBS[params.tool], agent_door.FILE_ARGS[params.tool](**native)
            )
        finally:
            self._active.remove(active)
        result = fileop_execute.result(outcome)
        await self.write(
            p.encode_accepted(
                request.id, str(result["operationId"]), {"replayed": True} if result["replayed"] else None
            )
        )
        self.log.info(
            "gateway.filesystem.finished",
            request_id=request.id,
            operation_id=result["operationId"],
            tool=params.tool,
            ok=result["ok"],
        )
        return result

    # --- cancel ----------------------------------------------------------------------

    async def cancel(self, operation_id: str) -> dict[str, Any]:
        mine = [a for a in self._active if a.operation_id == operation_id]
        for active in mine:
            active.cancel_requested = True
        try:
            await door.call(self.settings.socket, agent_door.CANCEL, agent_door.Cancel(operation_id))
            cancelling = True
        except AirlockError as exc:
            if exc.code is not ErrorCode.NOT_FOUND:
                raise
            # Not in the runner yet (pending approval, or about to start): the
            # flag makes the gateway cancel it as soon as it is.
            cancelling = bool(mine)
            for active in mine:
                self._start_cancel(active, reason="cancel")
        self.log.info("gateway.cancel.requested", operation_id=operation_id, cancelling=cancelling)
        return {"operationId": operation_id, "cancelling": cancelling}

    def _start_cancel(self, active: _Active, *, reason: str) -> None:
        if active.cancel_task is not None or active.operation_id is None:
            return
        active.cancel_task = asyncio.create_task(self._cancel_until_running(active.operation_id, reason))

    async def _cancel_until_running(self, operation_id: str, reason: str) -> None:
        """Ask the door to cancel until it can (the runner registers a job a moment after approval)."""

        async def attempt() -> bool | None:
            try:
                await door.call(self.settings.socket, agent_door.CANCEL, agent_door.Cancel(operation_id))
            except AirlockError as exc:
                return False if exc.code is ErrorCode.NOT_FOUND else None
            except door.DoorUnavailable:
                return None
            return True

        if await cancel_until_running(attempt, retry_seconds=_CANCEL_RETRY_SECONDS):
            self.log.info("gateway.operation.cancelled", operation_id=operation_id, reason=reason)


# --- the stdio shell -----------------------------------------------------------------


def _reader_thread(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes | None], fd: int) -> None:
    # A daemon thread: a blocking read on stdin cannot be cancelled, and must
    # not keep the process alive after shutdown.
    while True:
        try:
            chunk = os.read(fd, 256 * 1024)
        except OSError:
            chunk = b""
        loop.call_soon_threadsafe(queue.put_nowait, chunk or None)
        if not chunk:
            return


async def serve(settings: Settings, *, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    write_lock = asyncio.Lock()

    async def write(frame: bytes) -> None:
        async with write_lock:
            view = memoryview(frame)
            while view:
                try:
                    written = os.write(stdout_fd, view)
                except BrokenPipeError:
                    return  # the controller went away; host work continues (reference/001)
                view = view[written:]

    gateway = Gateway(settings, write)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    threading.Thread(target=_reader_thread, args=(loop, queue, stdin_fd), name="stdin", daemon=True).start()
    reader = p.LineReader()
    gateway.log.info("gateway.started", socket=settings.socket, privileged=settings.privileged)
    while not gateway.shutting_down:
        chunk = await queue.get()
        if chunk is None:
            rest = reader.leftover()
            if rest.strip():
                await gateway.handle_line(rest)  # a last line without its newline
            break
        reader.feed(chunk)
        while not gateway.shutting_down:
            item = reader.next_line()
            if item is None:
                break
            if isinstance(item, p.GatewayError):
                await write(p.encode_error(item.request_id, item))
                continue
            if item.strip():
                await gateway.handle_line(item)
    await gateway.drain()
    gateway.log.info("gateway.stopped")
    return 0


def run(settings: Settings) -> int:
    log.configure("gateway", level=os.environ.get("AIRLOCK_LOG_LEVEL", "info"))
    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
