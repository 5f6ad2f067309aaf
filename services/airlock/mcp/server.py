"""`airlock mcp`: the asyncio shell around `airlock.mcp.session`.

It moves lines between stdio and the session, runs each tool call as a task,
and talks to the agent door as any agent does (native v1, one connection per
request).  stdout carries MCP messages only; diagnostics go to stderr.

A call the client gives up on must not leave a command running that the agent
believes abandoned: on `notifications/cancelled`, on end of input and on
SIGTERM, each running `execute` is withdrawn, on the agent door alone, as any
agent withdraws its own work (`cancel {operation_id}`): while it waits for an
operator that withdraws it (it is decided ``withdrawn`` and never runs); once
approved it stops the job (retried until the runner has it).  The operator
socket is used only to show ``status``: an agent needs no operator rights.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final, TypeVar

from airlock import __version__
from airlock.common import doorclient
from airlock.common.cancel import cancel_until_running
from airlock.common.codec import Event, Response, iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.wire import agent as agent_door
from airlock.common.wire import operator as op
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Empty, Verb
from airlock.mcp import jsonrpc, render, tools
from airlock.mcp.session import CancelCall, Send, Session, StartCall
from airlock.mcp.tools import ToolResult

# exec replies carry at most tools.CAPTURE_BYTES of output per stream (base64): 4 MiB, not 16.
# After the input ends, how long withdrawals may take before the process exits.
# The official SDK's stdio client waits 2 s after closing our stdin, then sends
# SIGTERM and waits 2 s more: cancelling a running command takes milliseconds.
SHUTDOWN_GRACE: Final = 3.0
CANCEL_RETRY: Final = 0.1

A = TypeVar("A", bound=Message)


def _say(event: str, **fields: Any) -> None:
    """One JSON line on stderr (MCP clients log a server's stderr)."""
    with contextlib.suppress(OSError, ValueError):
        print(json.dumps({"event": event, **fields}, default=str), file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Settings:
    agent_socket: str
    operator_socket: str | None
    session: str | None = None
    progress_interval: float = 5.0


@dataclass
class CallContext:
    """What a tool handler gets besides its arguments."""

    abandoned: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = field(default_factory=time.monotonic)
    # What the call is doing, for progress notifications; None sends none.
    phase: str | None = None
    on_phase: Callable[[], None] = lambda: None

    def set_phase(self, phase: str | None) -> None:
        self.phase = phase
        self.on_phase()


Handler = Callable[[dict[str, Any], CallContext], Awaitable[ToolResult]]


class DoorClient:
    """A door (agent.sock or operator.sock) as the tools use it: `common.doorclient`, answers as `Response`s."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._door = doorclient.DoorClient(path)

    async def call(
        self,
        verb: Verb[A, Any],
        args: A,
        on_event: Callable[[Event], None] | None = None,
        *,
        request_id: str | None = None,
    ) -> Response:
        """The final response; `OSError` when the socket cannot be used, `AirlockError` on a malformed reply."""
        rid = request_id or str(uuid.uuid4())
        try:
            data = await self._door.call(verb, args, on_event, request_id=rid)
        except doorclient.DoorUnavailable as exc:
            if isinstance(exc.cause, OSError):
                raise exc.cause from None
            raise AirlockError(ErrorCode.INVALID_REQUEST, exc.message) from None
        except AirlockError as exc:
            return Response(id=rid, ok=False, error=exc)
        return Response(id=rid, ok=True, data=data)


def _why(exc: BaseException, *, operator: bool = False) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such socket" if operator else "no such socket (is airlock running?)"
    if isinstance(exc, PermissionError):
        return (
            f"permission denied ({'operators need group airlock-admin' if operator else 'agents need group airlock'})"
        )
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused" if operator else "connection refused (is airlock running?)"
    if isinstance(exc, AirlockError):
        return f"malformed reply ({exc.message})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return str(exc) or type(exc).__name__


@dataclass
class _Run:
    """What the agent door has told us about one exec so far."""

    operation_id: str
    request_id: str
    pending: dict[str, Any] | None = None
    approved: bool = False
    final: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self, event: Event) -> None:
        if event.event == "pending_approval":
            self.pending = event.fields
        elif event.event == "approved":
            self.approved = True
        self.changed.set()


def _capture_refused(reply: Response) -> bool:
    error = reply.error
    return (
        not reply.ok
        and error is not None
        and error.code == ErrorCode.INVALID_ARGUMENTS
        and error.details.get("field") == "max_output_bytes"
    )


class AgentDoor:
    """The tools' handlers: requests on the agent door (and the operator door, read-mostly)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.agent = DoorClient(settings.agent_socket)
        self.operator = DoorClient(settings.operator_socket) if settings.operator_socket else None

    @property
    def handlers(self) -> Mapping[str, Handler]:
        # Issue 10's file tools get their handlers here, next to their ToolSpec in tools.BUILTIN.
        return {"execute": self.execute, "status": self.status}

    # --- execute ------------------------------------------------------------------

    async def execute(self, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        # Each call is its own operation, named here so a retry of this call
        # (a cancel, a lost connection) reaches it and nothing else.
        run = _Run(operation_id=f"mcp-{uuid.uuid4()}", request_id=str(uuid.uuid4()))
        try:
            args = tools.exec_args(
                arguments, now=iso_utc(), operation_id=run.operation_id, session=self.settings.session
            )
        except tools.ArgumentError as exc:
            return tools.argument_error(exc)

        def on_event(event: Event) -> None:
            run.note(event)
            if event.event == "pending_approval":
                wait = event.fields.get("timeout_seconds")
                up_to = f"up to {wait:g} s" if isinstance(wait, int | float) else "until the approval timeout"
                ctx.set_phase(
                    f"waiting for an operator to approve (rule {event.fields.get('rule')!r}, {up_to}); "
                    "this is normal, keep waiting"
                )
            elif event.event == "approved" and run.pending is not None:
                ctx.set_phase(f"approved by {event.fields.get('decided_by')}; running")
            elif event.event == "approved":
                ctx.phase = "running"  # decided at once by policy: no need to announce it

        withdraw = asyncio.create_task(self._withdraw_when_abandoned(run, ctx))
        try:
            reply = await self.agent.call(agent_door.EXEC, agent_door.Exec(**args), on_event, request_id=run.request_id)
            if _capture_refused(reply):
                # The operator set limits.max_output_bytes below what we ask to
                # capture: that ceiling is then also airlock's default, so ask for
                # nothing, as a new operation (the refused one is settled).
                run.operation_id, run.request_id = f"mcp-{uuid.uuid4()}", str(uuid.uuid4())
                args = {k: v for k, v in args.items() if k != "max_output_bytes"} | {"operation_id": run.operation_id}
                reply = await self.agent.call(
                    agent_door.EXEC, agent_door.Exec(**args), on_event, request_id=run.request_id
                )
        except (OSError, AirlockError) as exc:
            return render.unreachable(self.agent.path, _why(exc))
        finally:
            run.final = True
            run.changed.set()
            ctx.set_phase(None)
            withdraw.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await withdraw
        if reply.ok:
            assert reply.data is not None
            return render.render_evidence(reply.data, tools.output_limit(arguments))
        assert reply.error is not None
        return render.render_refusal(reply.error.code.value, reply.error.message, reply.error.details)

    async def _withdraw_when_abandoned(self, run: _Run, ctx: CallContext) -> None:
        await ctx.abandoned.wait()
        _say("mcp.call.withdrawing", operation_id=run.operation_id, request_id=run.request_id)
        while not run.final:
            run.changed.clear()
            if run.approved:
                # Not running yet (the runner registers it after journaling
                # `started`): asked again until it is, or until the call settled.
                if await cancel_until_running(
                    lambda: self._cancel(run), retry_seconds=CANCEL_RETRY, stop=lambda: run.final
                ):
                    _say("mcp.call.cancelled", operation_id=run.operation_id)
                return
            if run.pending is not None:
                # Waiting for an operator: the agent door's cancel withdraws it (decided
                # `withdrawn`; an operator's later approve finds nothing to approve).
                if await self._cancel(run):
                    _say("mcp.call.withdrawn", request_id=run.request_id)
                    return
            await run.changed.wait()

    async def _cancel(self, run: _Run) -> bool:
        try:
            reply = await self.agent.call(agent_door.CANCEL, agent_door.Cancel(run.operation_id))
        except (OSError, AirlockError):
            return False
        return reply.ok

    # --- status -------------------------------------------------------------------

    async def status(self, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        try:
            tools.status_args(arguments)
        except tools.ArgumentError as exc:
            return tools.argument_error(exc, "status")
        hello: dict[str, Any] | None = None
        agent_problem = None
        try:
            reply = await self.agent.call(agent_door.HELLO, agent_door.Control())
            if reply.ok:
                hello = reply.data
            else:
                assert reply.error is not None
                agent_problem = f"{reply.error.code.value}: {reply.error.message}"
        except (OSError, AirlockError) as exc:
            agent_problem = _why(exc)
        operator: dict[str, Any] | None = None
        operator_problem = "no operator socket configured"
        if self.operator is not None and hello is not None:
            try:
                reply = await self.operator.call(op.STATUS, Empty())
                if reply.ok:
                    operator = reply.data
                else:
                    assert reply.error is not None
                    operator_problem = f"{reply.error.code.value}: {reply.error.message}"
            except (OSError, AirlockError) as exc:
                operator_problem = _why(exc, operator=True)
        return tools.render_status(
            self.agent.path,
            hello,
            agent_problem,
            self.operator.path if self.operator else None,
            operator,
            operator_problem,
        )


class Server:
    """Reads client lines, writes session output, runs and withdraws calls."""

    def __init__(
        self, session: Session, handlers: Mapping[str, Handler], out: BinaryIO, progress_interval: float
    ) -> None:
        self.session = session
        self.handlers = handlers
        self.out = out
        self.progress_interval = progress_interval
        self.calls: dict[jsonrpc.RequestId, tuple[asyncio.Task[None], CallContext]] = {}
        self.closed = False

    def write(self, data: bytes) -> None:
        # A plain blocking write: messages are small or final, and a client that
        # stops reading its server's stdout stalls any stdio server alike.
        if self.closed:
            return
        try:
            self.out.write(data)
            self.out.flush()
        except (OSError, ValueError):
            self.closed = True  # the client is gone; the reader's end of input follows

    def dispatch(self, actions: list[Send | StartCall | CancelCall]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.write(action.data)
            elif isinstance(action, StartCall):
                ctx = CallContext()
                task = asyncio.create_task(self._run(action, ctx))
                self.calls[action.request_id] = (task, ctx)
                task.add_done_callback(functools.partial(self._forget, action.request_id))
            else:
                running = self.calls.get(action.request_id)
                _say("mcp.call.cancel_requested", request_id=action.request_id, reason=action.reason)
                if running is not None:
                    running[1].abandoned.set()

    def _forget(self, request_id: jsonrpc.RequestId, _task: asyncio.Task[None]) -> None:
        self.calls.pop(request_id, None)

    async def _run(self, start: StartCall, ctx: CallContext) -> None:
        def progress() -> None:
            if ctx.phase is not None:
                elapsed = time.monotonic() - ctx.started
                data = self.session.progress(start.request_id, elapsed, f"{ctx.phase} [{elapsed:.0f} s since the call]")
                if data is not None:
                    self.write(data)

        ctx.on_phase = progress

        async def tick() -> None:
            # Every few seconds while the call waits or runs, so a long approval
            # does not look like a hung call to a client that watches progress.
            while True:
                await asyncio.sleep(self.progress_interval)
                progress()

        ticker = asyncio.create_task(tick()) if start.progress_token is not None else None
        try:
            result = await self.handlers[start.tool](start.arguments, ctx)
        except Exception as exc:  # the shell's last line of defence: a tool error, never a dead server
            _say("mcp.call.failed", tool=start.tool, error=repr(exc))
            result = ToolResult(
                f"NOT RUN: airlock mcp failed internally ({type(exc).__name__}); see its stderr.", is_error=True
            )
        finally:
            if ticker is not None:
                ticker.cancel()
        data = self.session.complete(start.request_id, result)
        if data is not None:
            self.write(data)

    async def serve(self, chunks: asyncio.Queue[bytes | None]) -> None:
        buffer = jsonrpc.LineBuffer()
        while not self.closed:
            chunk = await chunks.get()
            if chunk is None:
                last = buffer.end_of_stream()
                if last is not None:
                    self.dispatch(self.session.receive(last))
                break
            buffer.feed(chunk)
            while (line := buffer.next_line()) is not None:
                if isinstance(line, jsonrpc.TooLong):
                    self.dispatch(self.session.too_long(line))
                else:
                    assert isinstance(line, bytes)
                    self.dispatch(self.session.receive(line))
        await self.shutdown()

    async def shutdown(self) -> None:
        """The session is over: withdraw what still runs, within a bounded grace."""
        running = list(self.calls.values())
        for _task, ctx in running:
            ctx.abandoned.set()
        if running:
            _, late = await asyncio.wait([t for t, _ in running], timeout=SHUTDOWN_GRACE)
            for task in late:
                task.cancel()


def _read_stdin(loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes | None], fd: int) -> None:
    """A daemon thread: works for pipes, files and terminals alike, and never blocks exit."""
    while True:
        try:
            chunk = os.read(fd, 256 * 1024)
        except OSError:
            chunk = b""
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(chunks.put_nowait, chunk or None)
        if not chunk:
            return


async def serve_stdio(settings: Settings) -> int:
    door = AgentDoor(settings)
    session = Session(tools=tools.BUILTIN, server_version=__version__)
    server = Server(session, door.handlers, sys.stdout.buffer, settings.progress_interval)
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # Like the end of input: withdraw running calls, then exit.
        loop.add_signal_handler(signum, chunks.put_nowait, None)
    threading.Thread(target=_read_stdin, args=(loop, chunks, sys.stdin.fileno()), daemon=True).start()
    _say("mcp.server.started", agent_socket=settings.agent_socket, operator_socket=settings.operator_socket)
    await server.serve(chunks)
    return 0
