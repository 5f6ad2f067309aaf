"""Conformance of agent.sock: every gate, both dialects, over a real socket."""

from __future__ import annotations

import base64
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.common.wire.operator import VERBS as OPERATOR_VERBS

from support import Stack, custom_stack, now_iso
from waits import until, wait_record

CONFIG = """
limits:
  max_connections: 3
  max_connections_per_agent: 3  # every test here is one agent (one uid)
  read_timeout_seconds: 2
  request_timeout_seconds: 3
  max_output_bytes: 4096
approval:
  timeout_seconds: 2
policy:
  default: ask
  rules:
    - name: tools
      decision: allow
      privileged: false
      commands:
        - [/usr/bin/true]
        - [/usr/bin/echo, "..."]
        - [/usr/bin/printf, "..."]
        - [/usr/bin/tr, "..."]
        - [/usr/bin/cat]
        - [/usr/bin/head, "..."]
        - [/usr/bin/sleep, "{seconds}"]
        - [/usr/bin/env]
        - [/usr/bin/pwd]
        - [/usr/bin/dash, -c, "..."]
    - name: no-rm
      decision: deny
      commands:
        - [/usr/bin/rm, "..."]
"""


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("door")), CONFIG) as s:
        yield s


def legacy(stack: Stack, **fields: Any) -> dict[str, Any]:
    body = {"id": str(uuid.uuid4()), "time": now_iso()} | fields
    replies = stack.send_raw(json.dumps(body).encode() + b"\n")
    assert len(replies) == 1, replies
    return replies[0]


def code(reply: dict[str, Any]) -> str:
    assert reply["ok"] is False, reply
    return str(reply["error"]["code"])


# --- gate 1: the connection cap ----------------------------------------------------


def test_over_the_connection_cap_a_client_gets_busy_without_sending_anything(door: Stack) -> None:
    held = []
    try:
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(door.agent)
            held.append(s)
        time.sleep(0.2)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as extra:
            extra.settimeout(5)
            extra.connect(door.agent)
            reply = json.loads(extra.recv(65536).splitlines()[0])
        assert reply["error"]["code"] == "busy" and reply["status"] == "error"
    finally:
        for s in held:
            s.close()
    until("the door serves again once the held connections closed", lambda: door.native("ping")["ok"])


# --- gate 2: the peer ------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_a_peer_outside_agents_is_unauthorized(door: Stack) -> None:
    # Let the socket file through (the peer check is what we test): the child
    # connects by a relative path from the runtime folder, so the private
    # pytest folders above it need not be opened to it.
    os.chmod(door.agent, 0o666)
    mode = door.runtime_dir.stat().st_mode & 0o777
    os.chmod(door.runtime_dir, 0o711)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody and ask
        try:
            os.close(read_fd)
            os.chdir(door.runtime_dir)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect("agent.sock")
                # The refusal comes before the request is read: read it first.
                os.write(write_fd, s.recv(65536))
        except BaseException as exc:
            os.write(write_fd, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    data = os.read(read_fd, 65536)
    os.close(read_fd)
    os.chmod(door.agent, 0o660)
    os.chmod(door.runtime_dir, mode)
    assert data.startswith(b"{"), data
    reply = json.loads(data.splitlines()[0])
    assert reply["error"]["code"] == "unauthorized"
    log = (door.runtime_dir / "logs" / "intake.log").read_text()
    assert '"peer_uid": 65534' in log and "intake.peer.refused" in log


# --- gate 3: reading ---------------------------------------------------------------------


def test_a_slow_drip_client_is_cut_off(door: Stack) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(door.agent)
        started = time.monotonic()
        reply = b""
        for byte in b'{"v":1,"id":"drip","verb":"ping","args":{}}':
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.3)
            if time.monotonic() - started > 6:
                break
        reply = s.recv(65536)
    assert json.loads(reply.splitlines()[0])["error"]["code"] == "read_timeout"
    assert time.monotonic() - started < 8


def test_data_then_eof_without_newline_is_missing_newline_in_both_dialects(door: Stack) -> None:
    native = door.send_raw(b'{"v":1,"id":"nl","verb":"ping","args":{}}')
    assert native[0]["error"]["code"] == "missing_newline" and native[0]["id"] == "nl"
    old = door.send_raw(json.dumps({"id": "nl2", "time": now_iso(), "pipeline": [["true"]]}).encode())
    assert old == [old[0]] and old[0]["status"] == "error" and old[0]["id"] == "nl2"
    assert "missing trailing newline" in old[0]["message"] and "JSON" not in old[0]["message"]


# --- gate 4: JSON and shape ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"{not json\n", "invalid_json"),
        (b"\xff\xfe\n", "invalid_utf8"),
        (b"[1,2,3]\n", "invalid_request"),
        (b'{"v":1,"id":"s1","verb":"exec","args":"nope"}\n', "invalid_request"),
        (b'{"v":"1","id":"s2","verb":"ping"}\n', "unsupported_version"),
    ],
)
def test_parse_and_shape_failures_are_one_structured_error(door: Stack, raw: bytes, expected: str) -> None:
    replies = door.send_raw(raw)
    assert len(replies) == 1 and replies[0]["error"]["code"] == expected


def test_the_id_is_echoed_when_it_can_be_recovered(door: Stack) -> None:
    assert door.send_raw(b'{"v":1,"id":"keep-me","verb":"ping","args":{}\n')[0]["id"] == "keep-me"
    assert door.send_raw(b'{"v":1,"verb":"ping","args":{\n')[0]["id"] is None
    assert door.send_raw(b"garbage\n")[0]["id"] == ""


# --- gate 5: fields ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"argv": ["echo", "a\x1bb"]}, "argv[1]"),
        ({"argv": ["echo", "a\u200bb"]}, "argv[1]"),
        ({"pipeline": [["echo"], ["tr", "a\u2066", "b"]]}, "pipeline[1][1]"),
        ({"argv": ["true"], "env": {"LANG": "C\nX"}}, "env.LANG"),
        ({"argv": ["true"], "env": {"BAD-NAME": "x"}}, "env key"),
        ({"argv": ["true"], "reason": "fix\x07"}, "reason"),
        ({"argv": ["true"], "session": "s\u202e"}, "session"),
        ({"argv": ["true"], "host": "h\x00"}, "host"),
        ({"argv": ["true"], "privileged": "yes"}, "privileged"),
        ({"argv": ["true"], "timeout_ms": -5}, "timeout_ms"),
        ({"argv": ["true"], "cwd": "relative"}, "cwd"),
        ({"argv": ["true"], "stdin": "***"}, "stdin"),
        ({"argv": []}, "argv"),
        ({"pipeline": []}, "pipeline"),
        ({"pipeline": [["true"], []]}, "pipeline[1]"),
        ({"argv": ["true"], "command": "true"}, "pipeline"),
        ({"argv": ["true"], "privileged": True, "forward_agent": True}, "forward_agent"),
        ({"argv": ["true"], "surprise": 1}, "surprise"),
    ],
)
def test_field_validation_names_the_field(door: Stack, args: dict[str, Any], field: str) -> None:
    reply = door.exec({"privileged": False} | args)
    assert code(reply) == "invalid_arguments", reply
    assert reply["error"]["details"]["field"] == field


HOSTILE_IDS = ["bad\x1bid", "r1 $(touch /tmp/pwned)", "a`id`", "<!channel>", "x\u202ey", "caf\u00e9", "x" * 257]


@pytest.mark.parametrize("bad_id", HOSTILE_IDS)
def test_a_request_id_outside_the_safe_alphabet_is_refused_in_both_dialects(door: Stack, bad_id: str) -> None:
    """Issue 28: an ID is 1-256 of [A-Za-z0-9._:-]; anything else is refused before it is journaled or echoed."""
    before = len(door.journal_rows())
    native = door.exec({"argv": ["true"], "privileged": False}, id=bad_id)
    assert code(native) == "invalid_request" and native["error"]["details"]["field"] == "id", native
    assert native["id"] is None and "[A-Za-z0-9._:-]" in native["error"]["details"]["allowed"]
    old = legacy(door, id=bad_id, pipeline=[["true"]], privileged=False)
    assert old["status"] == "error" and old["code"] == "invalid_arguments" and old["id"] == "", old
    assert "request ID" in old["message"]
    assert all(bad_id not in json.dumps(row) for row in door.journal_rows()[before:])
    # Control: the same requests with an ID of the alphabet run.
    good = f"ok.{uuid.uuid4()}:1_A-z"
    assert door.exec({"argv": ["true"], "privileged": False}, id=good)["ok"] is True
    assert legacy(door, id=f"l-{uuid.uuid4()}", pipeline=[["true"]], privileged=False)["status"] == "ok"


# --- gate 6: freshness ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "expected"),
    [(None, "stale_request"), ("yesterday", "invalid_arguments"), ("-120", "stale_request"), ("+60", "stale_request")],
)
def test_freshness(door: Stack, when: str | None, expected: str) -> None:
    args: dict[str, Any] = {"argv": ["true"], "privileged": False}
    if when is not None and when[0] in "+-":
        args["time"] = now_iso(float(when))
    else:
        args["time"] = when
    reply = door.native("exec", args)
    assert code(reply) == expected


def test_small_clock_skew_is_allowed(door: Stack) -> None:
    assert door.native("exec", {"argv": ["true"], "privileged": False, "time": now_iso(2)})["ok"] is True


# --- gate 7: environment -------------------------------------------------------------------------


def test_environment_allowlist(door: Stack) -> None:
    assert code(door.exec({"argv": ["true"], "privileged": False, "env": {"PATH": "/tmp"}})) == "invalid_arguments"
    ssh = door.exec({"argv": ["true"], "privileged": False, "env": {"SSH_AUTH_SOCK": "/tmp/agent"}})
    assert "forward_agent" in ssh["error"]["message"]
    ok = door.exec({"argv": ["env"], "privileged": False, "env": {"LC_ALL": "C.UTF-8", "TZ": "UTC"}})
    out = base64.b64decode(ok["data"]["stdout"]).decode()
    assert "LC_ALL=C.UTF-8" in out and "TZ=UTC" in out
    assert "LISTEN_FDS" not in out and "NOTIFY_SOCKET" not in out


# --- gate 8: replay -------------------------------------------------------------------------------


def test_a_request_id_is_used_once_and_a_rejected_request_does_not_consume_it(door: Stack) -> None:
    rid = str(uuid.uuid4())
    stale = door.native("exec", {"argv": ["true"], "privileged": False, "time": "2020-01-01T00:00:00Z"}, id=rid)
    assert code(stale) == "stale_request"
    assert door.exec({"argv": ["true"], "privileged": False}, id=rid)["ok"] is True
    again = door.exec({"argv": ["true"], "privileged": False, "operation_id": "other"}, id=rid)
    assert code(again) == "replayed_request"


# --- control actions -------------------------------------------------------------------------------


def test_legacy_ping_passes_the_gates(door: Stack) -> None:
    rid = str(uuid.uuid4())
    pong = legacy(door, id=rid, pipeline=[], action="ping")
    assert pong["status"] == "ok" and pong["message"] == "pong" and pong["version"]
    assert legacy(door, id=rid, pipeline=[], action="ping")["status"] == "error"  # replayed
    assert legacy(door, pipeline=[], action="ping", time="2020-01-01T00:00:00Z")["status"] == "error"
    assert legacy(door, pipeline=[], action="launch")["status"] == "error"


def test_native_hello(door: Stack) -> None:
    data = door.native("hello")["data"]
    assert data["name"] == "airlock" and data["protocol_versions"] == [1] and "exec" in data["verbs"]


def test_stop_makes_intake_exit_and_the_next_connection_is_served(door: Stack) -> None:
    reply = legacy(door, pipeline=[], action="stop")
    assert reply["status"] == "ok"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if door.native("ping")["ok"]:
                break
        except OSError:
            time.sleep(0.2)
    assert door.native("ping")["ok"] is True
    log = (door.runtime_dir / "logs" / "intake.log").read_text()
    assert "intake.stop.requested" in log and log.count("intake.service.started") >= 2


# --- the reference/000 dialect ----------------------------------------------------------------------


def test_legacy_exec_shape(door: Stack) -> None:
    reply = legacy(
        door,
        pipeline=[["printf", "hello"], ["tr", "a-z", "A-Z"]],
        privileged=False,
        host="h",
        session="s",
        reason="r",
        extra_field_is_ignored=True,
    )
    assert reply["status"] == "ok"
    assert base64.b64decode(reply["stdout"]) == b"HELLO"
    assert reply["stages"] == [{"exit_code": 0, "stderr": ""}, {"exit_code": 0, "stderr": ""}]
    assert "stdout_truncated" not in reply and reply["version"]


def test_legacy_truncation_flags_appear_only_when_true(door: Stack) -> None:
    reply = legacy(door, pipeline=[["head", "-c", "10000", "/dev/zero"]], privileged=False)
    assert reply["status"] == "ok" and reply["stdout_truncated"] is True
    assert len(base64.b64decode(reply["stdout"])) == 4096


def test_legacy_defaults_to_privileged_and_a_fresh_id(door: Stack) -> None:
    body = {"time": now_iso(), "pipeline": [["true"]]}
    reply = door.send_raw(json.dumps(body).encode() + b"\n")[0]
    uuid.UUID(reply["id"])  # a fresh UUIDv4 was assigned
    # privileged by default: the `tools` rule only allows unprivileged, so this asks and times out
    # (or, without root, is refused as privilege_unavailable).
    assert reply["status"] in ("timeout", "error")


def test_legacy_denied_and_timeout(door: Stack) -> None:
    denied = legacy(door, pipeline=[["rm", "-rf", "/nonexistent"]], privileged=False)
    assert denied["status"] == "denied" and "no-rm" in denied["message"]
    timeout = legacy(door, pipeline=[["ls"]], privileged=False)
    assert timeout["status"] == "timeout"


# --- the native exec contract ------------------------------------------------------------------------


def test_exec_forms(door: Stack) -> None:
    argv = door.exec({"argv": ["echo", "one"], "privileged": False})["data"]
    assert base64.b64decode(argv["stdout"]) == b"one\n" and argv["mode"] == "exec"
    shell = door.exec({"command": "echo two; exit 4", "privileged": False})["data"]
    assert base64.b64decode(shell["stdout"]) == b"two\n" and shell["stages"][0]["exit_code"] == 4
    assert shell["mode"] == "shell"


def test_a_denial_names_the_rule(door: Stack) -> None:
    reply = door.exec({"argv": ["rm", "-rf", "/nonexistent"], "privileged": False})
    assert code(reply) == "denied" and reply["error"]["details"]["rule"] == "no-rm"


def test_approval_timeout(door: Stack) -> None:
    assert code(door.exec({"argv": ["ls"], "privileged": False})) == "approval_timeout"


def test_stdin_cwd_and_timeout(door: Stack, tmp_path: Path) -> None:
    cat = door.exec({"argv": ["cat"], "privileged": False, "stdin": base64.b64encode(b"fed").decode()})["data"]
    assert base64.b64decode(cat["stdout"]) == b"fed"
    pwd = door.exec({"argv": ["pwd"], "privileged": False, "cwd": str(tmp_path)})["data"]
    assert base64.b64decode(pwd["stdout"]).decode().strip() == str(tmp_path) and pwd["cwd"] == str(tmp_path)
    slow = door.exec({"argv": ["sleep", "30"], "privileged": False, "timeout_ms": 300})["data"]
    assert slow["timed_out"] is True and slow["stages"][0]["signal"] is not None


def test_protected_values_are_redacted(door: Stack) -> None:
    reply = door.exec({"command": "echo token=$LANG", "privileged": False, "protected_env": {"LANG": "s3cr3t-value"}})
    assert base64.b64decode(reply["data"]["stdout"]) == b"token=[redacted]\n"
    rows = door.journal_rows()
    assert not any("s3cr3t-value" in (r["payload"] or "") for r in rows)


def test_streaming_events_share_one_seq_and_precede_the_response(door: Stack) -> None:
    body = {
        "v": 1,
        "id": "st1",
        "verb": "exec",
        "token": None,
        "args": {"command": "echo out; echo err >&2", "privileged": False, "stream": True, "time": now_iso()},
    }
    replies = door.send_raw(json.dumps(body).encode() + b"\n")
    events = [r for r in replies if "event" in r]
    assert replies[-1]["ok"] is True and "event" not in replies[-1]
    names = [e["event"] for e in events]
    assert names[0] == "accepted" and "approved" in names and names[-1] == "finished"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    streamed = {e["event"]: base64.b64decode(e["data"]) for e in events if e["event"] in ("stdout", "stderr")}
    assert streamed == {"stdout": b"out\n", "stderr": b"err\n"}


def test_operation_replay_and_conflict(door: Stack) -> None:
    op = f"op-{uuid.uuid4()}"
    first = door.exec({"command": "echo $$", "privileged": False, "operation_id": op})["data"]
    again = door.exec({"command": "echo $$", "privileged": False, "operation_id": op})["data"]
    assert first["replay"] is False and again["replay"] is True and again["stdout"] == first["stdout"]
    assert (
        code(door.exec({"command": "echo other", "privileged": False, "operation_id": op})) == "operation_id_conflict"
    )


def test_identical_requests_without_an_operation_id_both_run(door: Stack) -> None:
    """Issue 30: only a named operation replays; each unnamed request is its own operation."""
    first = door.exec({"command": "echo $$", "privileged": False, "session": "retry-test"})["data"]
    second = door.exec({"command": "echo $$", "privileged": False, "session": "retry-test"})["data"]
    assert first["replay"] is False and second["replay"] is False
    assert second["operation_id"] != first["operation_id"]
    assert base64.b64decode(second["stdout"]) != base64.b64decode(first["stdout"])  # it ran again


def test_cancel_from_the_starting_peer(door: Stack) -> None:
    import threading

    op = f"op-{uuid.uuid4()}"
    result: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: result.update(door.exec({"argv": ["sleep", "30"], "privileged": False, "operation_id": op}))
    )
    t.start()
    wait_record(door, "exec.started", operation_id=op)
    cancel = door.native("cancel", {"operation_id": op})
    t.join(20)
    assert cancel["ok"] is True and cancel["data"]["cancelling"] is True
    assert result["data"]["cancelled"] is True
    assert code(door.native("cancel", {"operation_id": "op-not-running"})) == "not_found"


def test_the_agent_door_refuses_operator_verbs_like_a_bad_token_and_names_its_own_verbs(door: Stack) -> None:
    # The door's guard (intake) runs before its verb table (the service shell's dispatch).
    for verb in sorted(OPERATOR_VERBS - {"cancel"}):
        reply = door.native(verb, {}, id=f"probe-{verb}")
        assert reply["id"] == f"probe-{verb}"
        assert reply["error"] == {"code": "unauthorized", "message": "unauthorized", "details": {}}, verb
    hello = door.native("hello")["data"]
    unknown = door.native("frobnicate", {}, id="uv")
    assert unknown["error"]["code"] == "unknown_verb"
    assert unknown["error"]["details"]["verbs"] == hello["verbs"]  # in the order hello lists them
    assert door.native("cancel", {"operation_id": "never-ran"})["error"]["code"] == "not_found"  # intake's own cancel
