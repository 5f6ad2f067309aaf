"""reference/004 (the native v1 envelope) conformance, black box, against `airlock dev up`.

Every assertion comes from a sentence of reference/004's protocol.md: the
envelope, exactly one of data/error matching ok, the closed list of error
codes, unsupported_version listing the supported versions, malformed input
that never takes the daemon down, the operator/worker socket rules, the paged
events feed, the CLI's --json and a few-lines shell client.  airlock's agent
socket plays the worker socket.  One stack for the module.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Stack, now_iso, start_stack, stop_stack

# reference/004: "Error codes: ..." -- the closed list a client may switch on.
CODES = {
    "invalid_arguments",
    "invalid_request",
    "unsupported_version",
    "unknown_verb",
    "daemon_unavailable",
    "unauthorized",
    "not_found",
    "conflict",
    "cooldown_active",
    "internal",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(Path(tmp_path_factory.mktemp("ref004")))
    try:
        yield s
    finally:
        stop_stack(s)


def envelope(verb: str, args: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "id": f"req-{uuid.uuid4()}",
        "verb": verb,
        "args": args if args is not None else {},
        "token": None,
    } | fields


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def client(path: str, data: bytes, *, expect: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
    """An operator client as reference/004 describes it: write lines, read one response line per request.

    No shutdown of our side: each request stands alone and the client reads
    exactly the answers it is owed (like `nc -U ... | head -1`).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(data)
        reader = sock.makefile("rb")
        out = [json.loads(reader.readline()) for _ in range(expect)]
    return out


def call(
    stack: Stack, verb: str, args: dict[str, Any] | None = None, *, path: str | None = None, **fields: Any
) -> dict[str, Any]:
    req = envelope(verb, args, **fields)
    reply = client(path or stack.operator, line(req))[0]
    assert_envelope(reply, req.get("id"))
    return reply


def assert_envelope(reply: dict[str, Any], request_id: Any = ...) -> None:
    """Exactly one of `data` or `error`, matching `ok`; errors carry code, message, details."""
    assert isinstance(reply.get("ok"), bool), reply
    if request_id is not ...:
        assert reply["id"] == request_id, reply
    if reply["ok"]:
        assert set(reply) == {"id", "ok", "data"}, reply
        assert isinstance(reply["data"], dict)
    else:
        assert set(reply) == {"id", "ok", "error"}, reply
        error = reply["error"]
        assert set(error) == {"code", "message", "details"}, error
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["details"], dict)


def assert_code(reply: dict[str, Any], code: str) -> None:
    assert_envelope(reply)
    assert reply["ok"] is False and reply["error"]["code"] == code, reply
    assert code in CODES


def alive(stack: Stack) -> None:
    assert call(stack, "status")["ok"] is True


# --- the envelope ----------------------------------------------------------------------------------


def test_the_documented_request_gets_the_documented_response(stack: Stack) -> None:
    reply = client(stack.operator, b'{"v": 1, "id": "req-1", "verb": "status", "args": {}, "token": null}\n')[0]
    assert reply["id"] == "req-1" and reply["ok"] is True
    assert_envelope(reply, "req-1")


@pytest.mark.parametrize("request_id", ["1", "req-1", "a" * 256, "A.z_0:9-", None])
def test_the_id_is_echoed(stack: Stack, request_id: str | None) -> None:
    assert call(stack, "status", id=request_id)["id"] == request_id


@pytest.mark.parametrize("request_id", ["ünïcode-✓", "a b", "", "a" * 257])
def test_an_id_outside_the_alphabet_is_invalid_request_and_not_echoed(stack: Stack, request_id: str) -> None:
    """airlock's request IDs are 1-256 of [A-Za-z0-9._:-] on every socket (docs/protocol.md)."""
    reply = client(stack.operator, line(envelope("status", id=request_id)))[0]
    assert_code(reply, "invalid_request")
    assert reply["id"] is None and reply["error"]["details"]["field"] == "id"


def test_token_and_args_may_be_omitted(stack: Stack) -> None:
    reply = client(stack.operator, b'{"v":1,"id":"bare","verb":"status"}\n')[0]
    assert_envelope(reply, "bare")
    assert reply["ok"] is True


@pytest.mark.parametrize("version", [0, 2, 99, "1", None, "absent"])
def test_any_other_version_is_unsupported_version_listing_the_supported_ones(stack: Stack, version: Any) -> None:
    req = envelope("status", id="ver")
    if version == "absent":
        del req["v"]
    else:
        req["v"] = version
    reply = client(stack.operator, line(req))[0]
    assert_code(reply, "unsupported_version")
    assert reply["id"] == "ver"
    assert reply["error"]["details"]["supported"] == [1]
    alive(stack)


def test_unsupported_version_on_the_worker_socket_too(stack: Stack) -> None:
    reply = call(stack, "ping", path=stack.agent, v=2)
    assert_code(reply, "unsupported_version")
    assert reply["error"]["details"]["supported"] == [1]


def test_an_unknown_verb_is_unknown_verb_and_the_daemon_survives(stack: Stack) -> None:
    reply = call(stack, "frobnicate")
    assert_code(reply, "unknown_verb")
    assert "frobnicate" in reply["error"]["message"]
    alive(stack)


WELL_FORMED_ERRORS = [
    (b"[1,2,3]\n", "invalid_request"),
    (b'"status"\n', "invalid_request"),
    (b'{"v":1,"id":"x","verb":"status","args":[]}\n', "invalid_request"),
    (b'{"v":1,"id":"x","verb":42,"args":{}}\n', "invalid_request"),
    (b'{"v":1,"id":"x","args":{}}\n', "invalid_request"),
]
# The operator door keeps to reference/004's list; the precise reason is in details.reason.
MALFORMED = [
    pytest.param(b"{not json\n", id="not-json"),
    pytest.param(b"\n", id="empty-line"),
    pytest.param(b'{"v":1,"id":"x","verb":"status",\n', id="truncated"),
    pytest.param(b"\xff\xfe{}\n", id="not-utf8"),
]


@pytest.mark.parametrize(("data", "code"), WELL_FORMED_ERRORS)
def test_a_wrong_shape_is_a_structured_error(stack: Stack, data: bytes, code: str) -> None:
    replies = client(stack.operator, data)
    assert_code(replies[0], code)
    alive(stack)


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_json_gets_a_structured_error_with_a_listed_code(stack: Stack, data: bytes) -> None:
    reply = client(stack.operator, data)[0]
    assert_envelope(reply)
    alive(stack)
    assert reply["ok"] is False and reply["error"]["code"] in CODES, reply


@pytest.mark.parametrize("data", [b"{not json\n", b"\n", b"\xff\xfe{}\n", b"}{\n", b"nul\x00l\n"])
def test_malformed_json_never_takes_the_daemon_down(stack: Stack, data: bytes) -> None:
    for path in (stack.operator, stack.agent):
        reply = client(path, data)[0]
        assert reply["ok"] is False and isinstance(reply["error"]["code"], str)
        assert isinstance(reply["error"]["message"], str) and isinstance(reply["error"]["details"], dict)
    alive(stack)
    assert call(stack, "ping", path=stack.agent)["ok"] is True


def test_one_envelope_per_line_each_request_stands_alone(stack: Stack) -> None:
    first, second = envelope("status"), envelope("pending")
    replies = client(stack.operator, line(first) + b"{oops\n" + line(second), expect=3)
    assert replies[0]["id"] == first["id"] and replies[0]["ok"] is True
    assert replies[1]["ok"] is False
    assert replies[2]["id"] == second["id"] and replies[2]["ok"] is True
    for reply in replies:
        assert_envelope(reply)


def test_every_error_the_operator_socket_gives_is_from_the_closed_list(stack: Stack) -> None:
    replies = [
        call(stack, "show", {"ref": f"nothing-{uuid.uuid4()}"}),
        call(stack, "approve", {"id": f"nothing-{uuid.uuid4()}"}),
        call(stack, "deny", {"id": f"nothing-{uuid.uuid4()}"}),
        call(stack, "cancel", {"operation_id": f"nothing-{uuid.uuid4()}"}),
        call(stack, "events", {"after": "not-a-cursor"}),
        call(stack, "events", {"no_such_argument": 1}),
        call(stack, "show", {}),
        call(stack, "status", token="some-worker-token"),
    ]
    for reply in replies:
        assert reply["ok"] is False and reply["error"]["code"] in CODES, reply
    assert replies[0]["error"]["code"] == "not_found"
    assert replies[4]["error"]["code"] == "invalid_arguments"


# --- two sockets -----------------------------------------------------------------------------------


def test_the_operator_socket_is_mode_0600(stack: Stack) -> None:
    assert stat.S_IMODE(os.stat(stack.operator).st_mode) == 0o600


def test_a_worker_token_is_rejected_on_the_operator_socket(stack: Stack) -> None:
    reply = call(stack, "status", token="alt_0123456789abcdef")
    assert_code(reply, "unauthorized")
    # ... with the same error a bad token gets on the worker socket.
    worker = call(stack, "ping", path=stack.agent, token="alt_0123456789abcdef")
    assert_code(worker, "unauthorized")
    assert reply["error"] == worker["error"]


@pytest.mark.parametrize("verb", ["approve", "status", "events", "hold"])
def test_an_operator_verb_on_the_worker_socket_is_the_same_unauthorized(stack: Stack, verb: str) -> None:
    bad_token = call(stack, "ping", path=stack.agent, token="alt_0123456789abcdef")
    reply = call(stack, verb, {"id": "x"} if verb == "approve" else {}, path=stack.agent)
    assert_code(reply, "unauthorized")
    assert reply["error"] == bad_token["error"]


# --- the events feed ---------------------------------------------------------------------------------


def _make_activity(stack: Stack) -> None:
    reply = stack.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-{uuid.uuid4()}"})
    assert reply["ok"] is True, reply


def _events(stack: Stack, args: dict[str, Any]) -> dict[str, Any]:
    reply = call(stack, "events", args)
    assert reply["ok"] is True, reply
    data = reply["data"]
    assert isinstance(data["events"], list) and "next_cursor" in data
    return dict(data)


def test_events_returns_one_page_and_a_next_cursor(stack: Stack) -> None:
    _make_activity(stack)
    data = _events(stack, {})
    assert data["events"], data
    seqs = [e["seq"] for e in data["events"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_polling_with_after_next_cursor_follows_the_feed_without_gaps_or_repeats(stack: Stack) -> None:
    _make_activity(stack)
    latest = _events(stack, {"tail": 0})["next_cursor"]
    # Walk the whole feed in small pages...
    seen: list[int] = []
    cursor: Any = 0
    for _ in range(1000):
        data = _events(stack, {"after": cursor, "limit": 7})
        seen += [e["seq"] for e in data["events"]]
        if not data["events"]:
            break
        cursor = data["next_cursor"]
    assert seen == list(range(seen[0], seen[-1] + 1)), "pages skipped or repeated events"
    assert seen[-1] >= latest
    # ... nothing new: an empty page, and the cursor stays put.
    idle = _events(stack, {"after": cursor})
    assert idle["events"] == [] and idle["next_cursor"] == cursor
    # New activity shows up after the cursor, and only it.
    _make_activity(stack)
    fresh = _events(stack, {"after": cursor})
    assert fresh["events"] and all(e["seq"] > seen[-1] for e in fresh["events"])


def test_tail_starts_near_the_newest_event(stack: Stack) -> None:
    _make_activity(stack)
    everything = _events(stack, {"after": 0, "limit": 256})
    newest = _events(stack, {"tail": 3})
    assert len(newest["events"]) == 3
    tail_seqs = [e["seq"] for e in newest["events"]]
    assert tail_seqs == sorted(tail_seqs)
    # Following from the tail's cursor gives only what came after it.
    after = _events(stack, {"after": newest["next_cursor"]})
    assert all(e["seq"] > tail_seqs[-1] for e in after["events"])
    assert tail_seqs[-1] >= everything["events"][-1]["seq"]


def test_the_feed_is_the_same_for_every_client(stack: Stack) -> None:
    # No per-client state: the same question gives the same page, whoever asks, however often.
    _make_activity(stack)
    cursor = _events(stack, {"tail": 4})["events"][0]["seq"] - 1
    first = _events(stack, {"after": cursor, "limit": 3})
    second = _events(stack, {"after": cursor, "limit": 3})
    assert first["events"] == second["events"] and first["next_cursor"] == second["next_cursor"]
    assert [e["seq"] for e in first["events"]] == [cursor + 1, cursor + 2, cursor + 3]


# --- clients: a few lines of shell, and the CLI's --json -----------------------------------------------


def test_a_few_lines_of_shell_are_a_client(stack: Stack) -> None:
    # printf '%s\n' '{"v":1,"id":"1","verb":"status","args":{}}' | nc -U "$OPERATOR_SOCKET" | head -1
    # (nc may be missing here, so python's socket plays nc: write the line, print what comes back.)
    nc = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);s.sendall(sys.stdin.buffer.read())\n"
        "for chunk in iter(lambda: s.recv(65536), b''):\n"
        "    sys.stdout.buffer.write(chunk);sys.stdout.flush()\n"
    )
    script = (
        'printf \'%s\\n\' \'{"v":1,"id":"1","verb":"status","args":{}}\' '
        f'| {sys.executable} -c "$NC" "$OPERATOR_SOCKET" | head -1'
    )
    done = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ) | {"NC": nc, "OPERATOR_SOCKET": stack.operator},
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done
    reply = json.loads(lines[0])
    assert reply["id"] == "1" and reply["ok"] is True and isinstance(reply["data"], dict)


@pytest.mark.parametrize(
    "argv",
    [["status", "--json"], ["--json", "status"], ["pending", "--json"], ["events", "--tail", "2", "--json"]],
)
def test_the_cli_json_prints_the_envelope_verbatim(stack: Stack, argv: list[str]) -> None:
    done = stack.cli(*argv)
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    reply = json.loads(lines[0])
    assert_envelope(reply)
    assert reply["ok"] is True
    # Verbatim: the daemon's own compact serialisation, not a re-rendering.
    assert lines[0] == json.dumps(reply, separators=(",", ":"), ensure_ascii=False)


def test_the_cli_json_prints_an_error_envelope_and_exits_non_zero(stack: Stack) -> None:
    done = stack.cli("show", f"nothing-{uuid.uuid4()}", "--json")
    assert done.returncode != 0
    reply = json.loads(done.stdout)
    assert_code(reply, "not_found")


def test_the_cli_json_with_no_daemon_is_daemon_unavailable(stack: Stack, tmp_path: Path) -> None:
    done = stack.cli("status", "--json", "--socket", str(tmp_path / "absent.sock"))
    assert done.returncode != 0
    assert_code(json.loads(done.stdout), "daemon_unavailable")


def test_the_cli_json_matches_what_the_socket_says(stack: Stack) -> None:
    # "it gets exactly what the CLI gets": same shape and data for a stable verb.
    via_cli = json.loads(stack.cli("audit", "head", "--json").stdout)
    via_socket = call(stack, "audit.head")
    assert set(via_cli) == set(via_socket) and via_cli["ok"] is via_socket["ok"] is True
    assert set(via_cli["data"]) == set(via_socket["data"])


def test_a_time_stamped_worker_ping_is_checked_like_any_request(stack: Stack) -> None:
    # Not a reference/004 sentence, but the envelope rule still holds for airlock's own gates.
    reply = call(stack, "ping", {"time": now_iso()}, path=stack.agent)
    assert reply["ok"] is True and reply["data"]["message"] == "pong"
