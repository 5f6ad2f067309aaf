"""reference/000 (sudo-proxy) conformance, black box, against `airlock dev up`.

Every assertion here comes from a sentence of reference/000's protocol.md and
nothing else: a client written against that document must work unchanged.
The stack runs with the built-in dev policy (unprivileged work of the invoking
user is allowed, everything else asks an operator).  One stack for the module;
the tests that stop intake come last.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from support import Stack, now_iso, start_stack, stop_stack

# Response keys reference/000 defines; airlock may add more (the reference
# tells clients to ignore unknown fields), but these must be exactly right.
MAX_OUTPUT_BYTES = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(Path(tmp_path_factory.mktemp("ref000")))
    try:
        yield s
    finally:
        stop_stack(s)


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def request(**fields: Any) -> dict[str, Any]:
    """A request as a reference/000 client builds it: an id, a fresh time."""
    return {"id": str(uuid.uuid4()), "time": now_iso()} | fields


def send(stack: Stack, obj: dict[str, Any]) -> dict[str, Any]:
    replies = stack.send_raw(line(obj))
    assert len(replies) == 1, replies
    return replies[0]


def assert_error(reply: dict[str, Any], request_id: str | None = None) -> str:
    """reference/000's error shape: status error, a message, the daemon's version."""
    assert reply["status"] == "error", reply
    assert isinstance(reply["message"], str) and reply["message"], reply
    assert isinstance(reply["version"], str) and reply["version"], reply
    assert "stages" not in reply and "stdout" not in reply
    if request_id is not None:
        assert reply["id"] == request_id
    return str(reply["message"])


def b64(value: str) -> bytes:
    return base64.b64decode(value, validate=True)


def operator(stack: Stack, verb: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    reply = stack.native(verb, args, path=stack.operator)
    assert reply["ok"] is True, reply
    return dict(reply["data"])


class Pending:
    """A privileged request (the default) left waiting for an operator, on a thread."""

    def __init__(self, stack: Stack, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.reply: dict[str, Any] | None = None

        def run() -> None:
            self.reply = send(stack, obj)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for entry in operator(stack, "pending")["pending"]:
                if entry["request_id"] == obj["id"]:
                    self.entry: dict[str, Any] = entry
                    return
            time.sleep(0.1)
        raise AssertionError(f"request {obj['id']} never became pending")

    def result(self) -> dict[str, Any]:
        self.thread.join(30)
        assert self.reply is not None, "no reply in time"
        return self.reply


# --- responses: shapes byte for byte -------------------------------------------------------------


def test_single_command_success_shape(stack: Stack) -> None:
    req = request(pipeline=[["sh", "-c", "printf out; printf err >&2"]], privileged=False)
    reply = send(stack, req)
    assert set(reply) == {"id", "status", "stages", "stdout", "version"}, reply
    assert reply["id"] == req["id"] and reply["status"] == "ok"
    assert reply["stages"] == [{"exit_code": 0, "stderr": base64.b64encode(b"err").decode()}]
    assert b64(reply["stdout"]) == b"out"
    assert isinstance(reply["version"], str) and reply["version"]


def test_the_reply_is_one_compact_json_line(stack: Stack) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(stack.agent)
        sock.sendall(line(request(pipeline=[["true"]], privileged=False)))
        data = b""
        while chunk := sock.recv(65536):  # the daemon closes: one request per connection
            data += chunk
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert isinstance(json.loads(data), dict)


def test_two_stage_pipeline_hoists_the_last_stdout(stack: Stack) -> None:
    reply = send(
        stack, request(pipeline=[["sh", "-c", "printf hello; printf one >&2"], ["tr", "a-z", "A-Z"]], privileged=False)
    )
    assert reply["status"] == "ok"
    assert [set(s) for s in reply["stages"]] == [{"exit_code", "stderr"}, {"exit_code", "stderr"}]
    assert reply["stages"][0] == {"exit_code": 0, "stderr": base64.b64encode(b"one").decode()}
    assert reply["stages"][1] == {"exit_code": 0, "stderr": ""}
    assert b64(reply["stdout"]) == b"HELLO"


def test_three_stages_are_a_b_c(stack: Stack) -> None:
    reply = send(stack, request(pipeline=[["printf", "c\\nb\\na\\n"], ["sort"], ["head", "-n", "2"]], privileged=False))
    assert reply["status"] == "ok" and len(reply["stages"]) == 3
    assert b64(reply["stdout"]) == b"a\nb\n"


def test_a_failing_command_is_still_status_ok_with_its_exit_code(stack: Stack) -> None:
    reply = send(stack, request(pipeline=[["sh", "-c", "exit 3"]], privileged=False))
    assert reply["status"] == "ok"
    assert reply["stages"] == [{"exit_code": 3, "stderr": ""}]
    assert reply["stdout"] == ""


def test_truncation_flags_appear_when_the_daemon_capped_at_16_mib(stack: Stack) -> None:
    over = MAX_OUTPUT_BYTES + 4096
    script = f"head -c {over} /dev/zero; head -c {over} /dev/zero >&2"
    reply = send(stack, request(pipeline=[["sh", "-c", script]], privileged=False))
    assert reply["status"] == "ok"
    assert reply["stdout_truncated"] is True
    assert reply["stages"][0]["stderr_truncated"] is True
    assert len(b64(reply["stdout"])) == MAX_OUTPUT_BYTES
    assert len(b64(reply["stages"][0]["stderr"])) == MAX_OUTPUT_BYTES


# --- field defaults ------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["absent", "empty"])
def test_id_defaults_to_a_fresh_uuid4(stack: Stack, missing: str) -> None:
    ids = []
    for _ in range(2):
        req = request(pipeline=[["true"]], privileged=False)
        if missing == "absent":
            del req["id"]
        else:
            req["id"] = ""
        reply = send(stack, req)
        assert reply["status"] == "ok", reply
        assert uuid.UUID(reply["id"]).version == 4
        ids.append(reply["id"])
    assert ids[0] != ids[1]


def test_host_session_reason_env_may_be_omitted(stack: Stack) -> None:
    reply = send(stack, {"id": str(uuid.uuid4()), "time": now_iso(), "pipeline": [["true"]], "privileged": False})
    assert reply["status"] == "ok"


def test_the_example_request_fields_are_accepted(stack: Stack) -> None:
    req = request(
        host="workstation.local",
        session="claude-code-project-alpha",
        pipeline=[["sh", "-c", 'printf %s "$DEBIAN_FRONTEND"']],
        env={"DEBIAN_FRONTEND": "noninteractive"},
        reason="Install nginx to set up a web server",
        privileged=False,
        forward_agent=False,
    )
    reply = send(stack, req)
    assert reply["status"] == "ok" and b64(reply["stdout"]) == b"noninteractive"


@pytest.mark.parametrize(
    "when",
    [
        lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),  # the reference's own example format
        lambda: datetime.now(UTC).isoformat(),  # +00:00, microseconds
        lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123+00:00",  # nanoseconds (chrono's rfc3339)
        lambda: (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S+02:00"),  # another offset
    ],
)
def test_fresh_iso_8601_times_in_common_spellings_are_accepted(stack: Stack, when: Any) -> None:
    reply = send(stack, request(time=when(), pipeline=[["true"]], privileged=False))
    assert reply["status"] == "ok", reply


@pytest.mark.parametrize("when", [None, "", "yesterday", "2026-13-45T99:00:00Z", 1700000000, "2020-01-01T00:00:00Z"])
def test_time_missing_unparseable_or_stale_is_rejected(stack: Stack, when: Any) -> None:
    req = request(pipeline=[["true"]], privileged=False)
    if when is None:
        del req["time"]
    else:
        req["time"] = when
    assert "time" in assert_error(send(stack, req), req["id"])


def test_privileged_defaults_to_true_and_goes_through_approval(stack: Stack) -> None:
    # The dev policy allows unprivileged work at once, so a request that waits
    # for an operator was read as privileged.
    pending = Pending(stack, request(pipeline=[["id", "-u"]]))
    assert pending.entry["privileged"] is True
    operator(stack, "approve", {"id": pending.obj["id"], "reason": "conformance"})
    reply = pending.result()
    assert reply["status"] == "ok" and b64(reply["stdout"]) == b"0\n"  # sudo: ran as root


def test_denied_shape(stack: Stack) -> None:
    pending = Pending(stack, request(pipeline=[["true"]], privileged=True))
    operator(stack, "deny", {"id": pending.obj["id"], "reason": "conformance"})
    reply = pending.result()
    assert reply["id"] == pending.obj["id"] and reply["status"] == "denied"
    assert isinstance(reply["version"], str)
    assert "stages" not in reply and "stdout" not in reply


def test_forward_agent_defaults_to_false_and_needs_privileged_false(stack: Stack) -> None:
    req = request(pipeline=[["true"]], forward_agent=True)  # privileged defaults to true
    assert "forward_agent" in assert_error(send(stack, req), req["id"])
    req = request(pipeline=[["true"]], privileged=True, forward_agent=True)
    assert "forward_agent" in assert_error(send(stack, req), req["id"])
    assert send(stack, request(pipeline=[["true"]], privileged=False, forward_agent=True))["status"] == "ok"


def test_action_defaults_to_exec_and_exec_may_be_explicit(stack: Stack) -> None:
    assert send(stack, request(pipeline=[["true"]], privileged=False))["status"] == "ok"
    assert send(stack, request(pipeline=[["true"]], privileged=False, action="exec"))["status"] == "ok"


@pytest.mark.parametrize("pipeline", ["absent", []])
def test_an_exec_with_an_empty_or_missing_pipeline_is_rejected(stack: Stack, pipeline: Any) -> None:
    req = request(privileged=False) | ({} if pipeline == "absent" else {"pipeline": pipeline})
    assert "pipeline must not be empty" in assert_error(send(stack, req), req["id"])


def test_unknown_fields_are_ignored(stack: Stack) -> None:
    req = request(
        pipeline=[["printf", "x"]],
        privileged=False,
        future_field={"nested": [1, 2]},
        priority=7,
        client="some-client/2.0",
    )
    reply = send(stack, req)
    assert reply["status"] == "ok" and b64(reply["stdout"]) == b"x"


# --- framing -------------------------------------------------------------------------------------


def test_a_partial_line_then_close_is_missing_trailing_newline_not_invalid_json(stack: Stack) -> None:
    req = request(pipeline=[["true"]], privileged=False)
    replies = stack.send_raw(json.dumps(req).encode())  # no \n, then EOF
    assert len(replies) == 1
    message = assert_error(replies[0])
    assert "missing trailing newline" in message.lower()
    assert "json" not in message.lower()


def test_a_truncated_json_fragment_without_newline_is_also_missing_newline(stack: Stack) -> None:
    replies = stack.send_raw(b'{"id":"frag","pipeline":[["tru')
    message = assert_error(replies[0])
    assert "missing trailing newline" in message.lower() and "invalid json" not in message.lower()


def test_a_request_just_under_1_mb_is_served(stack: Stack) -> None:
    req = request(pipeline=[["true"]], privileged=False, padding="")
    req["padding"] = "p" * (1_000_000 - len(line(req)))  # unknown field: ignored
    assert len(line(req)) == 1_000_000
    assert send(stack, req)["status"] == "ok"


def test_a_request_over_1_mb_gets_one_error(stack: Stack) -> None:
    req = request(pipeline=[["true"]], privileged=False, padding="p" * (1024 * 1024 + 100))
    replies = stack.send_raw(line(req))
    assert len(replies) == 1
    assert_error(replies[0])


def test_a_much_larger_request_still_gets_its_error_reply(stack: Stack) -> None:
    req = request(pipeline=[["true"]], privileged=False, padding="p" * (8 * 1024 * 1024))
    replies = stack.send_raw(line(req))
    assert len(replies) == 1
    assert_error(replies[0])


def test_not_json_is_an_error_with_a_message(stack: Stack) -> None:
    replies = stack.send_raw(b"this is not json\n")
    assert len(replies) == 1
    assert_error(replies[0])
    assert replies[0]["id"] == ""


def test_one_request_per_connection(stack: Stack) -> None:
    first = request(pipeline=[["printf", "1"]], privileged=False)
    second = request(pipeline=[["printf", "2"]], privileged=False)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(stack.agent)
        sock.sendall(line(first) + line(second))
        data = b""
        while chunk := sock.recv(65536):  # no shutdown from our side: the daemon must close
            data += chunk
    replies = [json.loads(x) for x in data.splitlines()]
    assert len(replies) == 1 and replies[0]["id"] == first["id"] and b64(replies[0]["stdout"]) == b"1"
    # The unread second request was never processed, so its id is still unused.
    assert send(stack, second)["status"] == "ok"


# --- control actions -----------------------------------------------------------------------------


def test_ping_replies_pong_without_prompting(stack: Stack) -> None:
    req = request(pipeline=[], action="ping")  # privileged defaults to true, yet no approval
    started = time.monotonic()
    reply = send(stack, req)
    assert time.monotonic() - started < 10
    assert reply["id"] == req["id"] and reply["status"] == "ok" and reply["message"] == "pong"
    assert isinstance(reply["version"], str) and reply["version"]
    assert "stages" not in reply
    assert operator(stack, "pending")["pending"] == []


def test_ping_passes_freshness(stack: Stack) -> None:
    for when in (None, "not a time", "2020-01-01T00:00:00Z"):
        req = request(pipeline=[], action="ping")
        if when is None:
            del req["time"]
        else:
            req["time"] = when
        assert_error(send(stack, req), req["id"])


def test_a_replayed_ping_is_rejected(stack: Stack) -> None:
    req = request(pipeline=[], action="ping")
    assert send(stack, req)["status"] == "ok"
    assert_error(send(stack, req), req["id"])


def test_a_request_id_cannot_be_replayed_across_actions(stack: Stack) -> None:
    req = request(pipeline=[["true"]], privileged=False)
    assert send(stack, req)["status"] == "ok"
    assert_error(send(stack, req | {"time": now_iso()}), req["id"])
    assert_error(send(stack, req | {"time": now_iso(), "pipeline": [], "action": "ping"}), req["id"])


def test_control_actions_pass_field_sanitization(stack: Stack) -> None:
    req = request(pipeline=[], action="ping", reason="evil\x1b[2J")
    assert_error(send(stack, req), req["id"])


def test_a_stale_or_replayed_stop_does_not_stop_the_daemon(stack: Stack) -> None:
    pid = stack.service_pid("intake")
    stale = request(pipeline=[], action="stop", time="2020-01-01T00:00:00Z")
    assert_error(send(stack, stale), stale["id"])
    used = request(pipeline=[], action="ping")
    assert send(stack, used)["status"] == "ok"
    replayed = used | {"action": "stop", "time": now_iso()}
    assert_error(send(stack, replayed), used["id"])
    assert send(stack, request(pipeline=[], action="ping"))["status"] == "ok"
    assert stack.service_pid("intake") == pid


# --- stop: last, it takes intake down ------------------------------------------------------------


def _ping_until_served(stack: Stack, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return send(stack, request(pipeline=[], action="ping"))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def stopped(stack: Stack) -> dict[str, Any]:
    """One stop request, sent once; the tests below inspect its effects."""
    pid = stack.service_pid("intake")
    req = request(pipeline=[], action="stop")
    reply = send(stack, req)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"request": req, "reply": reply, "pid": pid}


def test_stop_replies_ok_and_the_daemon_exits(stack: Stack, stopped: dict[str, Any]) -> None:
    reply = stopped["reply"]
    assert reply["id"] == stopped["request"]["id"] and reply["status"] == "ok"
    assert isinstance(reply["version"], str)
    assert not Path(f"/proc/{stopped['pid']}").exists(), "intake did not exit after stop"
    # `dev up` (like systemd's socket) brings a fresh intake back.
    assert _ping_until_served(stack)["status"] == "ok"


def test_a_captured_stop_cannot_be_replayed_later(stack: Stack, stopped: dict[str, Any]) -> None:
    _ping_until_served(stack)
    pid = stack.service_pid("intake")
    reply = send(stack, stopped["request"])  # the same bytes, still inside the freshness window
    assert reply["status"] == "error", reply
    assert stack.service_pid("intake") == pid
