"""`airlock gateway --stdio` driven as a reference/001 controller would drive it.

A real stack (`airlock dev up`), a real gateway subprocess; JSON lines written
to its stdin, JSON lines read from its stdout.
"""

from __future__ import annotations

import hashlib
import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from support import Stack

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Gateway:
    """A gateway subprocess and the frames it writes."""

    def __init__(self, stack: Stack, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airlock", "gateway", "--stdio", "--socket", stack.agent, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.frames: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.raw: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.seen: list[dict[str, Any]] = []

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            self.frames.put(json.loads(line))
        self.frames.put(None)

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, method: str, params: dict[str, Any] | None = None, rid: str | None = None) -> str:
        rid = rid or f"r-{uuid.uuid4().hex[:8]}"
        self.send_raw(json.dumps({"id": rid, "method": method, "params": params or {}}).encode() + b"\n")
        return rid

    def next(self, timeout: float = 30) -> dict[str, Any]:
        frame = self.frames.get(timeout=timeout)
        assert frame is not None, "the gateway closed stdout"
        self.seen.append(frame)
        return frame

    def until_response(self, rid: str, timeout: float = 60) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Frames of request ``rid`` up to and including its response."""
        deadline = time.monotonic() + timeout
        frames: list[dict[str, Any]] = [f for f in self.seen if f.get("requestId") == rid]
        for f in frames:
            if f["type"] == "response":
                return frames[:-1], f
        while True:
            frame = self.next(max(0.1, deadline - time.monotonic()))
            if frame.get("requestId") != rid:
                continue
            if frame["type"] == "response":
                return frames, frame
            frames.append(frame)

    def call(self, method: str, params: dict[str, Any] | None = None, rid: str | None = None) -> dict[str, Any]:
        return self.until_response(self.send(method, params, rid))[1]

    def close(self) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture
def gw(stack: Stack) -> Iterator[Gateway]:
    g = Gateway(stack)
    try:
        yield g
    finally:
        g.close()


def op_id() -> str:
    return f"op-test-{uuid.uuid4().hex[:12]}"


def test_hello_and_health(gw: Gateway) -> None:
    hello = gw.call("hello", rid="hello-1")
    assert hello["type"] == "response" and hello["requestId"] == "hello-1" and hello["ok"] is True
    assert hello["result"]["name"] == "airlock"
    assert hello["result"]["protocolVersion"] == "1.0"
    assert hello["result"]["transport"] == "stdio-jsonl"
    assert hello["result"]["version"]
    health = gw.call("health")
    assert health["ok"] is True
    assert health["result"]["status"] == "ok"
    assert health["result"]["activeOperations"] == []


def test_exec_argv_streams_then_terminal_then_response(gw: Gateway) -> None:
    op = op_id()
    rid = gw.send(
        "process.exec", {"operationId": op, "executable": "sh", "args": ["-c", "printf out; printf err >&2; exit 3"]}
    )
    events, response = gw.until_response(rid)
    assert events[0]["type"] == "accepted"
    assert events[0]["operationId"] == op and events[0]["protocolVersion"] == "1.0"
    streams = [e for e in events if e.get("event") == "process.stream"]
    assert {(e["stream"], e["data"]) for e in streams} == {("stdout", "out"), ("stderr", "err")}
    assert [e["sequence"] for e in streams] == list(range(1, len(streams) + 1))
    assert all(e["operationId"] == op and e["truncated"] is False for e in streams)
    terminal = events[-1]
    assert terminal["type"] == "event" and terminal["event"] == "process.terminal"
    # A non-zero exit is still a successful transport response: the evidence says so.
    assert response["ok"] is True
    result = response["result"]
    assert result["exitCode"] == 3 and result["signal"] is None
    assert result["cancelled"] is False and result["timedOut"] is False and result["truncated"] is False
    assert result["stdout"] == "out" and result["stderr"] == "err"
    assert result["executionForm"] == "executable" and result["shell"] is False
    assert result["operationId"] == op
    for key in ("startedAt", "endedAt", "durationMs", "cwd", "uid", "gid", "hostname", "stdoutSha256", "stderrSha256"):
        assert key in result, key
    assert {k: v for k, v in terminal.items() if k not in ("type", "event", "requestId")} == result


def test_exec_command_uses_the_shell(gw: Gateway) -> None:
    response = gw.call("process.exec", {"operationId": op_id(), "command": "echo $((6*7)) | tr 4 X", "cwd": "/tmp"})
    assert response["ok"] is True
    result = response["result"]
    assert result["stdout"] == "X2\n" and result["exitCode"] == 0
    assert result["executionForm"] == "command" and result["shell"] is True and result["cwd"] == "/tmp"


def test_exec_form_is_exactly_one(gw: Gateway) -> None:
    both = gw.call("process.exec", {"command": "true", "executable": "true"})
    assert both["ok"] is False and both["error"]["code"] == "invalid_params"
    neither = gw.call("process.exec", {"args": ["x"]})
    assert neither["ok"] is False and neither["error"]["code"] == "invalid_params"
    cmd_args = gw.call("process.exec", {"command": "true", "args": ["x"]})
    assert cmd_args["ok"] is False
    ok = gw.call("process.exec", {"operationId": op_id(), "command": "true", "args": []})
    assert ok["ok"] is True


def test_env_is_string_coerced(gw: Gateway) -> None:
    response = gw.call("process.exec", {"operationId": op_id(), "command": 'printf "%s" "$TZ"', "env": {"TZ": 3}})
    assert response["ok"] is True and response["result"]["stdout"] == "3"


def test_replay_returns_the_stored_outcome_and_survives_a_gateway_restart(stack: Stack) -> None:
    op = op_id()
    params = {"operationId": op, "command": "date +%s%N; echo $$"}
    first = Gateway(stack)
    try:
        original = first.call("process.exec", params)
        again = first.call("process.exec", params)
    finally:
        first.close()
    assert original["ok"] and again["ok"]
    assert again["result"]["replayed"] is True and original["result"]["replayed"] is False
    assert again["result"]["stdout"] == original["result"]["stdout"]
    second = Gateway(stack)
    try:
        rid = second.send("process.exec", params)
        events, after_restart = second.until_response(rid)
    finally:
        second.close()
    assert after_restart["ok"] is True and after_restart["result"]["replayed"] is True
    assert after_restart["result"]["stdout"] == original["result"]["stdout"]
    assert [e.get("event", e["type"]) for e in events] == ["accepted", "process.terminal"]


def test_conflict_same_operation_id_other_request(gw: Gateway) -> None:
    op = op_id()
    assert gw.call("process.exec", {"operationId": op, "command": "echo one"})["ok"] is True
    conflict = gw.call("process.exec", {"operationId": op, "command": "echo two"})
    assert conflict["ok"] is False and conflict["error"]["code"] == "operation_id_conflict"


def test_in_progress(gw: Gateway) -> None:
    op = op_id()
    params = {"operationId": op, "command": "sleep 2"}
    first = gw.send("process.exec", params)
    while not any(f.get("requestId") == first and f["type"] == "accepted" for f in gw.seen):
        gw.next()
    busy = gw.call("process.exec", params)
    assert busy["ok"] is False and busy["error"]["code"] == "operation_in_progress"
    health = gw.call("health")
    assert op in health["result"]["activeOperations"]
    _, done = gw.until_response(first)
    assert done["ok"] is True


def test_without_an_operation_id_identical_requests_both_run(gw: Gateway) -> None:
    """Issue 30: replay only by name; reference/001 allows deriving an ID, airlock does not (docs/protocol.md)."""
    first = gw.call("process.exec", {"command": "date +%s%N"})
    second = gw.call("process.exec", {"command": "date +%s%N", "traceContext": {"traceparent": TRACEPARENT}})
    assert first["ok"] and second["ok"]
    assert first["result"]["operationId"] != second["result"]["operationId"]
    assert first["result"]["replayed"] is False and second["result"]["replayed"] is False
    assert first["result"]["stdout"] != second["result"]["stdout"]


def test_a_named_operation_replays_whatever_the_trace_context(gw: Gateway) -> None:
    op = op_id()
    first = gw.call("process.exec", {"operationId": op, "command": "date +%s%N"})
    second = gw.call(
        "process.exec", {"operationId": op, "command": "date +%s%N", "traceContext": {"traceparent": TRACEPARENT}}
    )
    assert first["ok"] and second["ok"]
    assert second["result"]["replayed"] is True and second["result"]["stdout"] == first["result"]["stdout"]


def test_protected_values_are_redacted_and_never_redelivered(gw: Gateway) -> None:
    op = op_id()
    secret = f"s3cret-{uuid.uuid4().hex}"
    params = {"operationId": op, "command": 'echo "token=$LANG"', "protectedValues": {"LANG": secret}}
    rid = gw.send("process.exec", params)
    events, response = gw.until_response(rid)
    assert response["ok"] is True
    assert secret not in json.dumps([*events, response])
    assert "[redacted]" in response["result"]["stdout"]
    again = gw.call("process.exec", params)
    assert again["ok"] is False and again["error"]["code"] == "protected_redelivery_forbidden"


def test_cancel_a_running_operation(gw: Gateway) -> None:
    op = op_id()
    rid = gw.send("process.exec", {"operationId": op, "command": "echo started; sleep 30"})
    while not any(f.get("requestId") == rid and f.get("event") == "process.stream" for f in gw.seen):
        gw.next()
    cancel = gw.call("cancel", {"operationId": op})
    assert cancel["ok"] is True and cancel["result"] == {"operationId": op, "cancelling": True}
    _, response = gw.until_response(rid, timeout=20)
    assert response["ok"] is True
    assert response["result"]["cancelled"] is True
    assert response["result"]["signal"] in ("SIGTERM", "SIGKILL")
    assert response["result"]["durationMs"] < 20_000


def test_cancel_unknown_operation_is_not_cancelling(gw: Gateway) -> None:
    response = gw.call("cancel", {"operationId": "op-nothing-here"})
    assert response["ok"] is True and response["result"] == {"operationId": "op-nothing-here", "cancelling": False}


def test_timeout(gw: Gateway) -> None:
    response = gw.call("process.exec", {"operationId": op_id(), "command": "sleep 10", "timeoutMs": 300})
    assert response["ok"] is True
    assert response["result"]["timedOut"] is True and response["result"]["cancelled"] is False


def test_max_output_bytes_overflow_truncates_and_terminates(gw: Gateway) -> None:
    params = {"operationId": op_id(), "command": "yes 0123456789", "maxOutputBytes": 1000, "timeoutMs": 20_000}
    rid = gw.send("process.exec", params)
    events, response = gw.until_response(rid, timeout=30)
    assert response["ok"] is True
    result = response["result"]
    assert result["truncated"] is True and result["stdoutTruncated"] is True
    assert len(result["stdout"].encode()) == 1000
    assert result["timedOut"] is False and result["cancelled"] is False
    assert result["durationMs"] < 15_000
    streamed = "".join(e["data"] for e in events if e.get("event") == "process.stream")
    assert len(streamed.encode()) <= 1000
    assert [e for e in events if e.get("event") == "process.stream"][-1]["truncated"] is True
    # The replayed evidence is the same: it is derived from the stored outcome alone.
    replay = gw.call("process.exec", params)["result"]
    assert replay["replayed"] is True
    assert {k: v for k, v in replay.items() if k != "replayed"} == {k: v for k, v in result.items() if k != "replayed"}


def test_large_output_fits_the_frame_limit(gw: Gateway) -> None:
    # 1 MiB of control characters is 6 MiB escaped: the text is shortened, never the frame cut.
    rid = gw.send("process.exec", {"operationId": op_id(), "command": "head -c 1048576 /dev/zero"})
    _, response = gw.until_response(rid, timeout=60)
    assert response["ok"] is True
    result = response["result"]
    assert result["transportTruncated"] is True and result["truncated"] is True
    assert 0 < len(result["stdout"]) < 1048576
    assert result["stdoutSha256"] == hashlib.sha256(result["stdout"].encode()).hexdigest()
    assert all(len(line) <= 2 * 1024 * 1024 for line in gw.raw)


def test_invalid_json_keeps_the_request_id(gw: Gateway) -> None:
    gw.send_raw(b'{"id":"broken-1","method":"hello","params":{\n')
    response = gw.next()
    assert response["type"] == "response" and response["ok"] is False
    assert response["error"]["code"] == "invalid_json" and response["requestId"] == "broken-1"
    gw.send_raw(b"not json at all\n")
    response = gw.next()
    assert response["error"]["code"] == "invalid_json" and response["requestId"] is None
    assert gw.call("hello")["ok"] is True  # still serving


def test_unknown_method(gw: Gateway) -> None:
    response = gw.call("process.teleport", rid="tp-1")
    assert response["requestId"] == "tp-1" and response["ok"] is False
    assert response["error"]["code"] == "unknown_method"


def test_trace_context_is_validated(gw: Gateway) -> None:
    for bad in (
        {"traceparent": "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"},
        {"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"},
        {"traceparent": "nonsense"},
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ):
        response = gw.call("process.exec", {"command": "true", "traceContext": bad})
        assert response["ok"] is False and response["error"]["code"] == "invalid_params", bad
    good = gw.call(
        "process.exec",
        {
            "operationId": op_id(),
            "command": "env",
            "traceContext": {"traceparent": TRACEPARENT, "tracestate": "vendor=x"},
        },
    )
    assert good["ok"] is True
    assert "traceparent" not in good["result"]["stdout"].lower() and TRACEPARENT not in good["result"]["stdout"]


def test_telemetry_configure_is_validated_and_reports_only_whether_headers_exist(gw: Gateway) -> None:
    response = gw.call(
        "telemetry.configure",
        {"enabled": True, "endpoint": "https://otel.example:4318", "headers": {"authorization": "Bearer abc"}},
    )
    assert response["ok"] is True
    assert response["result"]["enabled"] is True and response["result"]["headersConfigured"] is True
    assert "Bearer abc" not in json.dumps(response)
    bad = gw.call("telemetry.configure", {"enabled": "yes", "endpoint": "ftp://x"})
    assert bad["ok"] is False and bad["error"]["code"] == "invalid_params"
    # Never changes an outcome.
    assert gw.call("process.exec", {"operationId": op_id(), "command": "echo ok"})["result"]["stdout"] == "ok\n"


def test_shutdown_lets_active_operations_finish(stack: Stack) -> None:
    gw = Gateway(stack)
    try:
        op = op_id()
        running = gw.send("process.exec", {"operationId": op, "command": "sleep 1; echo done"})
        while not any(f.get("requestId") == running and f["type"] == "accepted" for f in gw.seen):
            gw.next()
        stop = gw.call("shutdown")
        assert stop["ok"] is True
        # Anything after shutdown is not read.
        gw.send("hello", rid="after-shutdown")
        _, done = gw.until_response(running)
        assert done["ok"] is True and done["result"]["stdout"] == "done\n"
        assert gw.proc.wait(30) == 0
        assert all(f.get("requestId") != "after-shutdown" for f in gw.seen)
    finally:
        gw.close()


def test_denied_is_an_error_response(stack: Stack) -> None:
    gw = Gateway(stack, "--privileged")
    try:
        # The dev policy allows unprivileged work only; privileged work waits for an
        # operator, so deny it from the operator door.
        rid = gw.send("process.exec", {"operationId": op_id(), "command": "id -u"})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pending = stack.native("pending", path=stack.operator)["data"]["pending"]
            if pending:
                break
            time.sleep(0.1)
        assert pending
        assert stack.native("deny", {"id": pending[0]["request_id"]}, path=stack.operator)["ok"] is True
        events, response = gw.until_response(rid)
        assert response["ok"] is False and response["error"]["code"] == "denied"
        assert any(e.get("event") == "approval.pending" for e in events)
    finally:
        gw.close()


def test_cancel_while_pending_approval_withdraws_it(stack: Stack) -> None:
    # A request waiting for an operator belongs to its agent: the agent's
    # cancel withdraws it at once (issue 16); nothing runs and nobody needs to deny it.
    gw = Gateway(stack, "--privileged")
    try:
        op = op_id()
        rid = gw.send("process.exec", {"operationId": op, "command": "sleep 30"})
        while not any(f.get("requestId") == rid and f.get("event") == "approval.pending" for f in gw.seen):
            gw.next()
        pending = [
            p for p in stack.native("pending", path=stack.operator)["data"]["pending"] if p["operation_id"] == op
        ]
        assert len(pending) == 1
        cancel = gw.call("cancel", {"operationId": op})
        assert cancel["result"] == {"operationId": op, "cancelling": True}
        _, response = gw.until_response(rid, timeout=30)
        assert response["ok"] is False and response["error"]["code"] == "withdrawn", response
        late = stack.native("approve", {"id": pending[0]["request_id"]}, path=stack.operator)
        assert late["error"]["code"] == "not_found"
        kinds = [r["kind"] for r in stack.journal_rows() if r["request_id"] == pending[0]["request_id"]]
        assert "exec.started" not in kinds, kinds
    finally:
        gw.close()
