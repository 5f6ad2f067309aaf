"""`airlock mcp` driven by the official MCP Python SDK's client (issue 11).

The SDK (a test-only dependency) starts `airlock mcp` as a subprocess over
stdio, exactly as Claude Code would, against a real `airlock dev up` whose
policy allows a few harmless commands, denies dd, and asks an operator for
everything else.  The test plays operator through the operator socket.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from support import Stack, custom_stack
from waits import pending as pending_now
from waits import until, until_async, wait_not_pending, wait_pending_with, wait_record

mcp = pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import get_default_environment, stdio_client  # noqa: E402

T = TypeVar("T")
MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
# mcp 1.x takes the per-call timeout as a timedelta, 2.x as seconds.
CLIENT_TIMEOUT: Any = 2.0 if MCP_MAJOR >= 2 else timedelta(seconds=2)

CONFIG = """
approval:
  timeout_seconds: 30
policy:
  default: ask
  rules:
    - name: harmless
      decision: allow
      commands:
        - [/usr/bin/echo, "..."]
        - [/usr/bin/printf, "..."]
        - [/usr/bin/tr, "..."]
        - [/usr/bin/cat]
        - [/usr/bin/sleep, "..."]
        - [/usr/bin/false]
        - [/usr/bin/head, "..."]
        - [/usr/bin/yes, "..."]
        - [/bin/sh, -c, "echo out; echo err >&2; exit 3"]
    - name: never-dd
      decision: deny
      commands: [[/usr/bin/dd, "..."]]
"""


@pytest.fixture(scope="module")
def mstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("mcp")), CONFIG) as s:
        yield s


def server_params(stack: Stack, *extra: str) -> StdioServerParameters:
    # The SDK passes a server only a few variables (HOME, PATH...): add the test's own PYTHONPATH, if any.
    env = get_default_environment() | {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "airlock", "mcp", "--socket", stack.agent, "--progress-interval", "0.3", *extra],
        env=env,
    )


@asynccontextmanager
async def connected(stack: Stack, *extra: str) -> AsyncIterator[ClientSession]:
    async with stdio_client(server_params(stack, *extra)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def run(coro: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(coro(), 120))  # type: ignore[arg-type]


def field(obj: Any, snake: str) -> Any:
    """A result field: mcp 2.x names them in snake_case, 1.x in camelCase."""
    if hasattr(obj, snake):
        return getattr(obj, snake)
    return getattr(obj, re.sub(r"_(\w)", lambda m: m.group(1).upper(), snake))


def needs_client_cancel() -> None:
    if MCP_MAJOR < 2:
        pytest.skip("mcp 1.x clients send no notifications/cancelled on a timeout (the raw-protocol test covers it)")


def text_of(result: Any) -> str:
    assert len(result.content) == 1 and result.content[0].type == "text", result
    return str(result.content[0].text)


async def wait_pending(stack: Stack, needle: str) -> dict[str, Any]:
    """The pending request whose command contains `needle`, as the operator sees it (off the event loop)."""
    return await asyncio.to_thread(wait_pending_with, stack, needle)


def journal_kinds(stack: Stack, request_id: str) -> list[str]:
    return [r["kind"] for r in stack.journal_rows() if r["request_id"] == request_id]


def request_id_of(stack: Stack, needle: str) -> str:
    rows = [r for r in stack.journal_rows() if r["kind"] == "request.received" and needle in r["payload"]]
    assert len(rows) == 1, rows
    return str(rows[0]["request_id"])


# --- the handshake and the listing -----------------------------------------------


def test_initialize_and_list_tools(mstack: Stack) -> None:
    async def main() -> None:
        async with stdio_client(server_params(mstack)) as (read, write), ClientSession(read, write) as session:
            init = await session.initialize()
            assert field(init, "server_info").name == "airlock"
            assert init.capabilities.tools is not None
            assert field(init, "protocol_version") in ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
            assert init.instructions and "execute" in init.instructions
            listed = await session.list_tools()
            tools = {t.name: t for t in listed.tools}
            assert set(tools) == {"execute", "status"}
            execute = tools["execute"]
            for word in ("root", "operator", "approve", "60 seconds", "DENIED", "Do not retry"):
                assert word in (execute.description or ""), word
            props = field(execute, "input_schema")["properties"]
            assert {"argv", "pipeline", "command", "privileged", "reason", "env", "cwd", "stdin", "timeout"} <= set(
                props
            )
            assert props["privileged"]["default"] is True
            await session.send_ping()

    run(main)


def test_the_sdk_client_in_auto_mode_falls_back_to_the_handshake(mstack: Stack) -> None:
    # mcp 2.x's Client probes `server/discover` first; airlock answers "method
    # not found" and the client falls back to `initialize`.
    client_cls = getattr(mcp, "Client", None)
    if client_cls is None:
        pytest.skip("this mcp SDK has no Client class")

    async def main() -> None:
        async with client_cls(server_params(mstack)) as client:
            result = await client.call_tool("execute", {"argv": ["echo", "auto"], "privileged": False})
            assert not field(result, "is_error") and "auto" in text_of(result)

    run(main)


# --- execute ----------------------------------------------------------------------


def test_execute_success_shows_exit_code_output_and_operation(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            result = await session.call_tool("execute", {"argv": ["echo", "hello from airlock"], "reason": "test"})
            text = text_of(result)
            assert field(result, "is_error") is False
            assert "exit code 0" in text and "hello from airlock" in text
            assert "operation mcp-" in text and "rule 'harmless'" in text and "ran as uid 0" in text

    run(main)


def test_execute_non_zero_exit_is_a_result_not_a_tool_error(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            result = await session.call_tool("execute", {"command": "echo out; echo err >&2; exit 3"})
            text = text_of(result)
            assert field(result, "is_error") is False
            assert "exit code 3" in text
            assert "--- stdout ---\nout" in text and "--- stderr ---\nerr" in text

    run(main)


def test_execute_pipeline_with_stdin_reports_every_stage(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            result = await session.call_tool(
                "execute", {"pipeline": [["cat"], ["tr", "a-z", "A-Z"]], "stdin": "shout\n", "privileged": False}
            )
            text = text_of(result)
            assert field(result, "is_error") is False
            assert "SHOUT" in text
            assert "stage 1 (cat): exit code 0; stage 2 (tr a-z A-Z): exit code 0" in text
            assert "stderr of stage 2 (tr a-z A-Z)" in text

    run(main)


def test_the_same_call_twice_runs_twice(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            first = text_of(await session.call_tool("execute", {"argv": ["echo", "twice"]}))
            second = text_of(await session.call_tool("execute", {"argv": ["echo", "twice"]}))
            assert "earlier run" not in second
            assert first.split("operation ")[1].split(";")[0] != second.split("operation ")[1].split(";")[0]

    run(main)


def test_execute_denied_names_the_rule(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            result = await session.call_tool("execute", {"argv": ["dd", "if=/dev/zero", "of=/dev/null", "count=1"]})
            text = text_of(result)
            assert field(result, "is_error") is True
            assert text.startswith("DENIED by policy rule 'never-dd'")
            assert "did not run" in text and "Do not retry" in text

    run(main)


def test_execute_bad_arguments_are_tool_errors_the_model_can_fix(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            both = await session.call_tool("execute", {"argv": ["true"], "command": "true"})
            assert field(both, "is_error") is True and "exactly one of argv, pipeline or command" in text_of(both)
            env = await session.call_tool("execute", {"argv": ["true"], "env": {"LD_PRELOAD": "/tmp/x.so"}})
            assert field(env, "is_error") is True and "env.LD_PRELOAD" in text_of(env)

    run(main)


def test_arguments_over_their_limits_are_refused_by_the_argument_s_name(mstack: Stack) -> None:
    # Issue 31: a large stdin was refused as "field payload" (the journal's cap);
    # status ignored its arguments although its schema forbids any.
    async def main() -> None:
        async with connected(mstack) as session:
            stdin = await session.call_tool("execute", {"argv": ["cat"], "stdin": "x" * 100_000})
            assert field(stdin, "is_error") is True
            assert "stdin: is 100000 bytes; the limit is 8192 bytes" in text_of(stdin)
            assert "payload" not in text_of(stdin)
            argv = await session.call_tool("execute", {"argv": ["echo", "y" * 20_000]})
            assert field(argv, "is_error") is True and "argv: is 20006 bytes; the limit is 8192" in text_of(argv)
            limit = await session.call_tool("execute", {"argv": ["echo"], "max_output_bytes": 2**30})
            assert field(limit, "is_error") is True and "max_output_bytes: must be 1 to 1048576" in text_of(limit)
            status = await session.call_tool("status", {"verbose": True})
            assert field(status, "is_error") is True and "unknown argument 'verbose'" in text_of(status)
            # Everything at its stated limit at once still fits airlock's audit record,
            # even when an operator is asked (the largest record): it waits for one.
            full = asyncio.create_task(
                session.call_tool(
                    "execute",
                    {
                        "argv": ["cat", "z" * (8192 - 5)],
                        "stdin": "s" * 8192,
                        "reason": "r" * 1024,
                        "cwd": "/" + "d" * 1023,
                        "env": {"LANG": "e" * (4096 - 6)},
                    },
                )
            )
            pending = await wait_pending(mstack, "zzzzzzzz")
            await asyncio.to_thread(mstack.native, "deny", {"id": pending["request_id"]}, path=mstack.operator)
            assert text_of(await full).startswith("DENIED by operator")

    run(main)


def test_large_output_is_cut_with_its_size_and_sha256_and_the_session_survives(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            big = await session.call_tool(
                "execute", {"pipeline": [["yes", "airlock text é"], ["head", "-c", str(11 * 1024 * 1024)]]}
            )
            text = text_of(big)
            assert field(big, "is_error") is False
            assert "--- stdout (CUT: showing the first 65536 of more than 4194304 bytes" in text
            assert "airlock keeps no copy of the output" in text and "max_output_bytes" in text
            assert len(text.encode()) < 70_000
            # 3 MiB of 0xff bytes (yes/tr/head: no file argument, which policy would ask about).
            binary = await session.call_tool(
                "execute", {"pipeline": [["yes", ""], ["tr", "\\n", "\\377"], ["head", "-c", str(3 * 1024 * 1024)]]}
            )
            assert f"--- stdout (binary, {3 * 1024 * 1024} bytes, sha256 " in text_of(binary)
            assert "airlock is reachable" in text_of(await session.call_tool("status", {}))

    run(main)


def test_an_over_long_request_is_answered_with_its_id(mstack: Stack) -> None:
    # The Python SDK writes "id" before "params": the error names the call, at once.
    async def main() -> None:
        async with connected(mstack) as session:
            started = time.monotonic()
            # McpError in mcp 1.x, MCPError in 2.x: matched by its message.
            with pytest.raises(Exception, match="longer than the limit of 1048576 bytes"):
                await session.call_tool("execute", {"argv": ["cat"], "stdin": "x" * (2 * 1024 * 1024)})
            assert time.monotonic() - started < 10
            assert "airlock is reachable" in text_of(await session.call_tool("status", {}))

    run(main)


def test_an_unreadable_line_gets_an_error_without_id_and_the_session_goes_on(mstack: Stack) -> None:
    client = RawClient(mstack)
    try:
        assert client.proc.stdin is not None
        client.proc.stdin.write(b"this is not json\n" + b'{"jsonrpc":"2.0","id":7,"method":"ping"\n')
        client.proc.stdin.flush()
        unreadable = client.reply()
        # No "id": null, which the TypeScript SDK drops (MCP 2025-11-25 makes it optional).
        assert "id" not in unreadable and unreadable["error"]["code"] == -32700
        assert client.reply() == {"jsonrpc": "2.0", "id": 7, "error": client_error(-32700)}
        client.send({"id": 8, "method": "ping"})
        assert client.reply() == {"jsonrpc": "2.0", "id": 8, "result": {}}
    finally:
        client.close()


def client_error(code: int) -> Any:
    class AnyMessage(dict[str, Any]):
        def __eq__(self, other: object) -> bool:
            return isinstance(other, dict) and other.get("code") == code and isinstance(other.get("message"), str)

    return AnyMessage()


def test_execute_timeout_is_reported(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            result = await session.call_tool("execute", {"argv": ["sleep", "10"], "timeout": 300})
            text = text_of(result)
            assert field(result, "is_error") is False and "TIMED OUT" in text

    run(main)


# --- status -----------------------------------------------------------------------


def test_status_reports_reachable_hold_and_pending(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            text = text_of(await session.call_tool("status", {}))
            assert "airlock is reachable" in text
            assert "Hold: off" in text and "Pending approvals: 0" in text

    run(main)


def test_status_without_the_operator_socket_says_unknown(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack, "--no-operator-socket") as session:
            text = text_of(await session.call_tool("status", {}))
            assert "airlock is reachable" in text and "unknown" in text

    run(main)


def test_status_when_airlock_is_down(tmp_path: Path) -> None:
    async def main() -> None:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "airlock", "mcp", "--socket", str(tmp_path / "agent.sock")]
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert "NOT reachable" in text_of(await session.call_tool("status", {}))
            result = await session.call_tool("execute", {"argv": ["true"]})
            assert field(result, "is_error") is True and "not reachable" in text_of(result)

    run(main)


# --- long approvals: progress, approval, timeout ----------------------------------


def test_progress_while_an_operator_decides_then_the_result(mstack: Stack) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def main() -> None:
        async with connected(mstack) as session:
            call = asyncio.create_task(
                session.call_tool(  # type: ignore[call-overload]  # the SDK's callback type differs across versions
                    "execute", {"argv": ["id", "-u"], "reason": "needs approval"}, progress_callback=on_progress
                )
            )
            pending = await wait_pending(mstack, '"id", "-u"')
            await until_async("3 progress notifications", lambda: len(progress) >= 3, timeout=10)
            approved = await asyncio.to_thread(
                mstack.native, "approve", {"id": pending["request_id"]}, path=mstack.operator
            )
            assert approved["ok"], approved
            result = await call
            assert field(result, "is_error") is False and "exit code 0" in text_of(result)
            assert "approved by operator" in text_of(result)

    run(main)
    waiting = [p for p in progress if p[2] and "waiting for an operator to approve" in p[2]]
    assert len(waiting) >= 3, progress
    values = [p[0] for p in progress]
    assert values == sorted(values) and len(set(values)) == len(values)  # strictly increasing


def test_operator_denial_names_the_operator(mstack: Stack) -> None:
    async def main() -> None:
        async with connected(mstack) as session:
            call = asyncio.create_task(session.call_tool("execute", {"argv": ["id", "-g"]}))
            pending = await wait_pending(mstack, '"id", "-g"')
            await asyncio.to_thread(
                mstack.native, "deny", {"id": pending["request_id"], "reason": "not today"}, path=mstack.operator
            )
            result = await call
            assert field(result, "is_error") is True
            assert text_of(result).startswith("DENIED by operator") and "not today" in text_of(result)

    run(main)


# --- cancellation -----------------------------------------------------------------


def test_a_cancelled_call_cancels_the_running_command(mstack: Stack) -> None:
    needs_client_cancel()

    async def main() -> None:
        async with connected(mstack) as session:
            # A client-side timeout: the SDK sends notifications/cancelled.
            with pytest.raises(Exception):  # noqa: B017, PT011 - the SDK's timeout error type differs across versions
                await session.call_tool("execute", {"argv": ["sleep", "31"]}, read_timeout_seconds=CLIENT_TIMEOUT)
            await asyncio.to_thread(wait_record, mstack, "exec.finished", request_id=request_id_of(mstack, '"31"'))
            # The server is still in good shape for the next call.
            assert not field(await session.call_tool("execute", {"argv": ["echo", "after"]}), "is_error")

    started = time.monotonic()
    run(main)
    assert time.monotonic() - started < 20
    rid = request_id_of(mstack, '"31"')
    kinds = journal_kinds(mstack, rid)
    assert "exec.cancelled" in kinds and "exec.finished" in kinds, kinds
    finished = [r for r in mstack.journal_rows() if r["request_id"] == rid and r["kind"] == "exec.finished"]
    assert json.loads(finished[0]["payload"])["cancelled"] is True


class RawClient:
    """`airlock mcp` driven by hand, for what an SDK does not let a test control."""

    def __init__(self, stack: Stack, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airlock", "mcp", "--socket", stack.agent, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send(
            {
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            }
        )
        assert self.reply()["id"] == 0
        self.send({"method": "notifications/initialized"})

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0"} | message).encode() + b"\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 30) -> dict[str, Any]:
        return self.replies.get(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_started(stack: Stack, needle: str) -> None:
    # exec.started names the spec by digest (issue 50): the request is found by its request.received.
    wait_record(stack, "request.received", containing=needle)
    wait_record(stack, "exec.started", request_id=request_id_of(stack, needle))


def wait_finished(stack: Stack, needle: str) -> list[str]:
    rid = request_id_of(stack, needle)
    wait_record(stack, "exec.finished", request_id=rid)
    return journal_kinds(stack, rid)


def test_notifications_cancelled_cancels_the_command_and_gets_no_response(mstack: Stack) -> None:
    client = RawClient(mstack)
    try:
        client.send(
            {"id": 2, "method": "tools/call", "params": {"name": "execute", "arguments": {"argv": ["sleep", "33"]}}}
        )
        wait_started(mstack, '"33"')
        client.send({"method": "notifications/cancelled", "params": {"requestId": 2, "reason": "user pressed Esc"}})
        assert "exec.cancelled" in wait_finished(mstack, '"33"')
        time.sleep(0.5)  # not a wait: a window in which a (wrong) late answer to id 2 would come first
        client.send({"id": 3, "method": "ping"})
        assert client.reply() == {"jsonrpc": "2.0", "id": 3, "result": {}}  # and nothing for id 2
    finally:
        client.close()


def test_ending_the_session_cancels_the_running_command(mstack: Stack) -> None:
    # The end of input alone, with no cancel notification.
    client = RawClient(mstack)
    try:
        client.send(
            {"id": 2, "method": "tools/call", "params": {"name": "execute", "arguments": {"argv": ["sleep", "32"]}}}
        )
        wait_started(mstack, '"32"')
        started = time.monotonic()
        assert client.proc.stdin is not None
        client.proc.stdin.close()  # the client goes away while the command runs
        assert client.proc.wait(10) == 0
        assert time.monotonic() - started < 3.5  # inside the SDK's grace before SIGTERM, with margin
        assert "exec.cancelled" in wait_finished(mstack, '"32"')
        # The client only closed its side: the answer still goes out, and says what happened.
        assert "CANCELLED" in client.reply(5)["result"]["content"][0]["text"]
    finally:
        client.close()


def test_without_the_operator_socket_a_cancelled_pending_call_is_withdrawn(mstack: Stack) -> None:
    """The agent door's own cancel withdraws a pending request: no operator rights needed (issue 39)."""
    client = RawClient(mstack, "--no-operator-socket")
    try:
        script = "sleep 35"  # no rule: an operator must decide
        client.send({"id": 2, "method": "tools/call", "params": {"name": "execute", "arguments": {"command": script}}})
        pending = wait_pending_with(mstack, script)
        client.send({"method": "notifications/cancelled", "params": {"requestId": 2}})
        wait_not_pending(mstack, pending["request_id"])
        late = mstack.native("approve", {"id": pending["request_id"]}, path=mstack.operator)
        assert late["ok"] is False, late  # nothing left to approve
        kinds = journal_kinds(mstack, pending["request_id"])
        assert "exec.started" not in kinds, kinds
        decided = [
            json.loads(r["payload"])
            for r in mstack.journal_rows()
            if r["request_id"] == pending["request_id"] and r["kind"] == "approval.decided"
        ]
        assert decided and decided[0]["decision"] == "withdrawn", decided
    finally:
        client.close()


def test_sigterm_cancels_the_running_command(mstack: Stack) -> None:
    client = RawClient(mstack)
    try:
        client.send(
            {"id": 2, "method": "tools/call", "params": {"name": "execute", "arguments": {"argv": ["sleep", "34"]}}}
        )
        wait_started(mstack, '"34"')
        client.proc.send_signal(signal.SIGTERM)
        assert client.proc.wait(10) == 0
        assert "exec.cancelled" in wait_finished(mstack, '"34"')
    finally:
        client.close()


def test_a_cancelled_call_waiting_for_approval_is_withdrawn(mstack: Stack) -> None:
    needs_client_cancel()

    async def main() -> None:
        async with connected(mstack) as session:
            with pytest.raises(Exception):  # noqa: B017, PT011 - as above: the SDK's timeout error
                await session.call_tool("execute", {"argv": ["id", "-n"]}, read_timeout_seconds=CLIENT_TIMEOUT)

            # The withdrawal follows the cancel notification, asynchronously.
            def withdrawn() -> bool:
                return not [p for p in pending_now(mstack) if '"-n"' in json.dumps(p["request"])]

            await asyncio.to_thread(until, "the cancelled request withdrawn", withdrawn)

    run(main)
    rid = request_id_of(mstack, '"-n"')
    kinds = journal_kinds(mstack, rid)
    assert "exec.started" not in kinds, kinds
    decided = [r for r in mstack.journal_rows() if r["request_id"] == rid and r["kind"] == "approval.decided"]
    assert decided and json.loads(decided[0]["payload"])["decision"] == "withdrawn", decided


def test_a_lower_capture_ceiling_set_by_the_operator_still_runs_and_says_so(tmp_path: Path) -> None:
    # airlock mcp asks the runner to capture 4 MiB a stream; an operator's lower
    # limits.max_output_bytes refuses that, and the call runs with the ceiling instead.
    config = CONFIG.replace("approval:\n", "limits:\n  max_output_bytes: 100000\napproval:\n", 1)
    with custom_stack(tmp_path / "rt", config) as stack:

        async def main() -> None:
            async with connected(stack) as session:
                result = await session.call_tool(
                    "execute", {"pipeline": [["yes", "x"], ["head", "-c", "300000"]], "max_output_bytes": 1000}
                )
                text = text_of(result)
                assert field(result, "is_error") is False, text
                assert "showing the first 1000 of more than 100000 bytes (airlock captured the first 100000)" in text
                assert "airlock stopped capturing stdout at 100000 bytes; the rest was discarded" in text

        run(main)
