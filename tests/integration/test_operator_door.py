"""Issue 8: every verb of operator.sock over a real socket, its envelope rules and who gets in."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_support import Background, ask, stack_with, wait_pending

from support import Stack


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from stack_with(Path(tmp_path_factory.mktemp("op")))


def op(stack: Stack, verb: str, args: dict[str, Any] | None = None, **envelope: Any) -> dict[str, Any]:
    return stack.native(verb, args, path=stack.operator, **envelope)


def actions(stack: Stack, action: str) -> list[dict[str, Any]]:
    rows = [r for r in stack.journal_rows() if r["kind"] == "operator.action"]
    return [r | {"payload": json.loads(r["payload"])} for r in rows if json.loads(r["payload"]).get("action") == action]


# --- reference/004 envelope rules on operator.sock ----------------------------------


def _assert_envelope(reply: dict[str, Any]) -> None:
    assert set(reply) == {"id", "ok", "data"} if reply["ok"] else set(reply) == {"id", "ok", "error"}, reply
    if not reply["ok"]:
        assert set(reply["error"]) == {"code", "message", "details"}


def test_every_reply_has_exactly_one_of_data_and_error(ops: Stack) -> None:
    probes: list[tuple[str, dict[str, Any]]] = [
        ("status", {}),
        ("pending", {}),
        ("events", {"tail": 2}),
        ("show", {"ref": "nope-nope"}),
        ("approve", {"id": "nope"}),
        ("audit.head", {}),
        ("frobnicate", {}),
    ]
    for verb, args in probes:
        reply = op(ops, verb, args, id=f"env-{verb}")
        assert reply["id"] == f"env-{verb}"
        _assert_envelope(reply)


def test_unsupported_version_lists_the_supported_ones(ops: Stack) -> None:
    replies = ops.send_raw(b'{"v":2,"id":"v2","verb":"status","args":{}}\n', path=ops.operator)
    assert len(replies) == 1
    _assert_envelope(replies[0])
    assert replies[0]["error"]["code"] == "unsupported_version"
    assert replies[0]["error"]["details"]["supported"] == [1]


def test_unknown_verb_names_the_known_ones(ops: Stack) -> None:
    reply = op(ops, "frobnicate", id="uv")
    assert reply["error"]["code"] == "unknown_verb"
    for verb in (
        "status",
        "pending",
        "show",
        "approve",
        "deny",
        "cancel",
        "hold",
        "release",
        "events",
        "policy.check",
        "audit.verify",
        "audit.head",
        "token.issue",
        "token.revoke",
    ):
        assert verb in reply["error"]["details"]["verbs"]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"this is not json\n", "invalid_json"),
        (b"[1,2]\n", None),
        (b"\xff\xfe\n", "invalid_utf8"),
        (b'{"v":1,"id":"nl","verb":"status","args":{}}', "missing_newline"),
        (b'{"v":1,"verb":"status","args":{},"extra":1}\n', None),
    ],
)
def test_malformed_input_gets_a_structured_error_and_the_daemon_survives(
    ops: Stack, data: bytes, code: str | None
) -> None:
    replies = ops.send_raw(data, path=ops.operator)
    assert len(replies) == 1
    _assert_envelope(replies[0])
    # The operator door keeps to reference/004's codes; the precise one is the reason.
    assert replies[0]["error"]["code"] == "invalid_request"
    assert replies[0]["error"]["details"].get("reason") == code
    assert op(ops, "status")["ok"] is True


def test_several_requests_on_one_connection_each_get_an_answer(ops: Stack) -> None:
    lines = b"".join(
        json.dumps({"v": 1, "id": f"m{i}", "verb": "status", "args": {}}).encode() + b"\n" for i in range(3)
    )
    replies = ops.send_raw(lines, path=ops.operator)
    assert [r["id"] for r in replies] == ["m0", "m1", "m2"]


# --- who gets in ---------------------------------------------------------------------


def test_a_token_on_the_operator_socket_is_unauthorized(ops: Stack) -> None:
    reply = op(ops, "status", token="alt_whatever")
    assert reply["error"] == {"code": "unauthorized", "message": "unauthorized", "details": {}}


def test_the_operator_socket_is_0600(ops: Stack) -> None:
    mode = os.stat(ops.operator).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def _as_nobody(path: str, request: bytes = b"") -> tuple[str, bytes]:
    """Fork a child that becomes `nobody` and connects to ``path``: ('ok', reply) or ('error', errno name).

    The child reaches the socket through an O_PATH descriptor opened by root, so
    only the socket's own mode decides (not the test's private temp folders).
    """
    import pwd

    nobody = pwd.getpwnam("nobody")
    handle = os.open(path, os.O_PATH)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, connect, report, exit
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(10)
                    sock.connect(f"/proc/self/fd/{handle}")
                    if request:  # the refusal must survive a client that writes first
                        sock.sendall(request)
                    data = b""
                    while chunk := sock.recv(65536):
                        data += chunk
                os.write(write_end, b"ok " + data)
            except OSError as exc:
                os.write(write_end, b"error " + type(exc).__name__.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.close(handle)
    out = b""
    while chunk := os.read(read_end, 65536):
        out += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    kind, _, rest = out.partition(b" ")
    return kind.decode(), rest


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_a_peer_that_is_not_an_operator_is_refused(ops: Stack) -> None:
    # The socket's mode is the first gate: nobody cannot even connect.
    request = b'{"v":1,"id":"x","verb":"status","args":{}}\n'
    kind, detail = _as_nobody(ops.operator, request)
    assert (kind, detail) == ("error", b"PermissionError")
    # With the mode opened up, the daemon's own SO_PEERCRED check still refuses.
    os.chmod(ops.operator, 0o666)
    try:
        kind, detail = _as_nobody(ops.operator, request)
    finally:
        os.chmod(ops.operator, 0o600)
    assert kind == "ok", detail
    reply = json.loads(detail)
    assert reply["ok"] is False and reply["error"]["code"] == "unauthorized"
    assert op(ops, "status")["ok"] is True


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_an_agent_that_is_not_an_operator_is_refused_on_the_operator_socket(ops: Stack) -> None:
    # nobody may use agent.sock in this test, but it is still no operator.
    os.chmod(ops.agent, 0o666)
    try:
        kind, detail = _as_nobody(ops.agent, b'{"id":"p","time":"2026-01-01T00:00:00Z","pipeline":[["true"]]}\n')
    finally:
        os.chmod(ops.agent, 0o660)
    assert kind == "ok", detail
    reply = json.loads(detail)  # not in agents.users either; answered in both dialects
    assert reply["error"]["code"] == "unauthorized" and reply["status"] == "error"


# --- status, pending, approve, deny, show ---------------------------------------------


def test_status_reports_services_counts_and_hold(ops: Stack) -> None:
    data = op(ops, "status")["data"]
    assert data["hold"] is False and data["hold_reason"] is None
    assert isinstance(data["pending"], int) and isinstance(data["tokens"], int)
    assert data["services"]["journal"]["state"] == "up"
    assert data["services"]["runner"]["state"] == "listening"
    assert data["services"]["intake"]["state"] == "listening"
    assert data["policy"]["default"] == "ask"


def test_pending_shows_what_a_reviewer_needs_then_approve_runs_it(ops: Stack) -> None:
    bg = ask(
        ops,
        ["sh", "-c", "echo approved-run"],
        reason="check the disk",
        session="s-approve",
        host="web1",
        env={"LANG": "C"},
    )
    item = wait_pending(ops, bg.request_id)
    assert item["operation_id"] == bg.operation_id
    assert item["peer"]["uid"] == os.getuid() and item["peer"]["pid"] > 0
    assert (item["session"], item["host"], item["reason"], item["privileged"]) == (
        "s-approve",
        "web1",
        "check the disk",
        False,
    )
    assert item["env_names"] == ["LANG"]
    stage = item["stages"][0]
    assert stage["argv"] == ["sh", "-c", "echo approved-run"]
    assert stage["resolved"] == os.path.realpath(stage["binary"])
    assert stage["symlink"] == (stage["binary"] != stage["resolved"])
    assert 0 < item["seconds_left"] <= 60
    # Issue 27: approve acts on the whole ID of a request pending now, never a prefix.
    assert op(ops, "approve", {"id": bg.request_id[:12], "reason": "looks fine"})["error"]["code"] == "not_found"
    reply = op(ops, "approve", {"id": bg.request_id, "reason": "looks fine", "expect": item["expect"]})
    assert reply["data"] == {"request_id": bg.request_id, "decision": "allow"}
    result = bg.result()
    assert result["ok"] is True, result
    assert result["data"]["decision"]["decided_by"] == pwd_name()
    # The operator's action is journaled with their uid and reason.
    row = next(r for r in actions(ops, "approve") if r["request_id"] == bg.request_id)
    assert row["peer_uid"] == os.getuid() and row["payload"]["reason"] == "looks fine"
    # A second decision on the same request: it is not pending any more.
    assert op(ops, "deny", {"id": bg.request_id})["error"]["code"] == "not_found"


def pwd_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def test_deny_refuses_the_request_with_the_operator_named(ops: Stack) -> None:
    bg = ask(ops)
    assert op(ops, "deny", {"id": bg.request_id, "reason": "not today"})["data"]["decision"] == "deny"
    result = bg.result()
    assert result["error"]["code"] == "denied"
    assert "not today" in result["error"]["message"]
    assert actions(ops, "deny")[-1]["payload"]["reason"] == "not today"


def test_show_finds_a_request_by_id_operation_and_prefix(ops: Stack) -> None:
    bg = ask(ops, ["echo", "shown"], reason="for show", session="s-show")
    pending = op(ops, "show", {"ref": bg.request_id})["data"]
    assert pending["state"] == "pending" and pending["pending"] is True and pending["settled"] is False
    assert pending["detail"]["stages"][0]["argv"] == ["echo", "shown"]
    # A pending request is found by a prefix a person types; so is a settled one (issue 44), from the journal.
    assert op(ops, "show", {"ref": bg.request_id[:10]})["data"]["request_id"] == bg.request_id
    assert op(ops, "show", {"ref": bg.operation_id[:12]})["error"]["code"] == "not_found"
    op(ops, "approve", {"id": bg.request_id})
    assert bg.result()["ok"] is True
    settled = op(ops, "show", {"ref": bg.request_id[:10]})["data"]
    assert settled["request_id"] == bg.request_id and settled["state"] == "finished"
    assert op(ops, "show", {"ref": bg.operation_id[:12]})["error"]["code"] == "not_found"  # never an operation's
    for ref in (bg.request_id, bg.operation_id):
        data = op(ops, "show", {"ref": ref})["data"]
        assert data["request_id"] == bg.request_id, ref
        assert data["operation_id"] == bg.operation_id
        assert data["state"] == "finished" and data["settled"] is True
        assert data["peer"]["uid"] == os.getuid()
        assert data["session"] == "s-show" and data["reason"] == "for show"
        assert data["request"]["stages"] == [["echo", "shown"]]
        assert data["decision"]["decision"] == "allow" and data["decision"]["by"] == pwd_name()
        assert data["outcome"]["status"] == "ok" and data["outcome"]["exit_codes"] == [0]
        kinds = [e["kind"] for e in data["events"]]
        for kind in (
            "request.received",
            "approval.pending",
            "approval.decided",
            "exec.started",
            "exec.finished",
            "request.replied",
        ):
            assert kind in kinds


def test_show_of_an_unknown_or_ambiguous_reference(ops: Stack) -> None:
    assert op(ops, "show", {"ref": "no-such-request-anywhere"})["error"]["code"] == "not_found"
    assert op(ops, "show", {})["error"]["code"] == "invalid_arguments"
    assert op(ops, "show", {"ref": "bg-"})["error"]["code"] in ("conflict", "not_found")


def test_self_approval_is_allowed_in_the_dev_config(ops: Stack) -> None:
    bg = ask(ops)
    assert op(ops, "approve", {"id": bg.request_id})["ok"] is True
    assert bg.result()["ok"] is True


# --- cancel ----------------------------------------------------------------------


def test_cancel_of_a_pending_operation_denies_it(ops: Stack) -> None:
    bg = ask(ops)
    reply = op(ops, "cancel", {"operation_id": bg.operation_id, "reason": "wrong host"})
    assert reply["data"]["was"] == "pending"
    result = bg.result()
    assert result["error"]["code"] == "denied" and "cancelled" in result["error"]["message"]
    assert actions(ops, "cancel")[-1]["payload"]["reason"] == "wrong host"


def test_cancel_of_a_running_operation_stops_it(ops: Stack) -> None:
    bg = ask(ops, ["sleep", "30"])
    op(ops, "approve", {"id": bg.request_id})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reply = op(ops, "cancel", {"operation_id": bg.operation_id})
        if reply["ok"]:
            break
        time.sleep(0.1)
    assert reply["ok"] is True and reply["data"]["was"] == "running", reply
    result = bg.result()
    assert result["ok"] is True and result["data"]["cancelled"] is True
    assert result["data"]["duration_ms"] < 20000


def test_cancel_of_nothing_is_not_found(ops: Stack) -> None:
    assert op(ops, "cancel", {"operation_id": "op-never-was"})["error"]["code"] == "not_found"


# --- hold and release ----------------------------------------------------------------


def test_hold_makes_allowed_work_wait_and_release_lifts_it(ops: Stack) -> None:
    assert op(ops, "hold", {})["error"]["code"] == "invalid_arguments"  # a reason is required
    assert op(ops, "hold", {"reason": "incident 42"})["data"] == {"hold": True, "reason": "incident 42"}
    try:
        assert op(ops, "status")["data"]["hold_reason"] == "incident 42"
        bg = Background(ops, {"argv": ["true"]})
        item = wait_pending(ops, bg.request_id)
        assert item["rule"] == "hold"
        op(ops, "approve", {"id": bg.request_id})
        assert bg.result()["ok"] is True
    finally:
        assert op(ops, "release")["data"] == {"hold": False, "released": []}
    assert ops.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-rel-{time.time()}"})["ok"] is True
    assert actions(ops, "hold")[-1]["payload"]["reason"] == "incident 42"
    assert actions(ops, "release")


# --- events paging (reference/004) -----------------------------------------------------


def test_events_pages_with_limit_cursor_and_latest(ops: Stack) -> None:
    for i in range(3):
        ops.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-ev-{i}-{time.time()}"})
    first = op(ops, "events", {"after": 0, "limit": 5})["data"]
    assert len(first["events"]) == 5 and first["next_cursor"] == first["events"][-1]["seq"]
    assert first["latest"] >= first["next_cursor"]
    second = op(ops, "events", {"after": first["next_cursor"], "limit": 5})["data"]
    assert second["events"][0]["seq"] == first["next_cursor"] + 1
    default = op(ops, "events", {"after": 0})["data"]
    assert len(default["events"]) == min(64, default["latest"])
    assert op(ops, "events", {"limit": 256})["ok"] is True
    assert op(ops, "events", {"limit": 257})["error"]["code"] == "invalid_arguments"
    assert op(ops, "events", {"limit": 0})["error"]["code"] == "invalid_arguments"
    assert op(ops, "events", {"bogus": 1})["error"]["code"] == "invalid_arguments"


def test_events_tail_wins_over_after(ops: Stack) -> None:
    both = op(ops, "events", {"after": 0, "tail": 2})["data"]
    assert len(both["events"]) == 2
    assert both["events"][-1]["seq"] == both["latest"] == both["next_cursor"]
    now = op(ops, "events", {"tail": 0})["data"]
    assert now["events"] == [] and now["next_cursor"] == now["latest"]


def test_events_scope_follows_one_request(ops: Stack) -> None:
    reply = ops.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-scope-{time.time()}"})
    data = op(ops, "events", {"scope": {"request_id": reply["id"]}})["data"]
    assert data["events"] and {e["request_id"] for e in data["events"]} == {reply["id"]}


def test_policy_check_and_audit_verbs(ops: Stack) -> None:
    check = op(ops, "policy.check", {"argv": ["true"], "privileged": False})["data"]
    assert check["decision"] == "allow" and check["rule"] == "allow-true"
    assert op(ops, "policy.check", {"argv": ["echo", "x"], "privileged": False})["data"]["decision"] == "ask"
    verify = op(ops, "audit.verify")["data"]
    assert verify["ok"] is True
    head = op(ops, "audit.head")["data"]
    assert head["seq"] >= 1 and len(head["hash"]) == 64
