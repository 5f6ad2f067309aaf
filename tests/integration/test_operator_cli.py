"""Issue 8: the `airlock` operator commands against a live stack: output, --json, exit codes."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_support import Background, ask, stack_with, wait_pending

from support import Stack


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from stack_with(Path(tmp_path_factory.mktemp("cli")), "approval:\n  timeout_seconds: 30\n")


def test_status_prints_short_lines_and_json_prints_the_envelope(ops: Stack) -> None:
    human = ops.cli("status")
    assert human.returncode == 0, human.stderr
    assert "state" in human.stdout and "accepting" in human.stdout and "journal" in human.stdout
    assert "\x1b[" not in human.stdout  # not a terminal: no colour
    # Issue 44: the chain's count and the live segment's said which is which.
    assert re.search(r"journal +up, \d+ events journaled \(head seq\)", human.stdout), human.stdout
    assert re.search(r"size +[\d.]+ \w+ with sealed segments, \d+ in the live one", human.stdout), human.stdout
    raw = ops.cli("status", "--json")
    envelope = json.loads(raw.stdout)
    assert envelope["ok"] is True and set(envelope) == {"id", "ok", "data"}


def test_socket_option_and_environment(ops: Stack, tmp_path: Path) -> None:
    assert ops.cli("status", "--socket", ops.operator, env={"AIRLOCK_OPERATOR_SOCKET": "/nonexistent"}).returncode == 0
    missing = ops.cli("status", env={"AIRLOCK_OPERATOR_SOCKET": str(tmp_path / "none.sock")})
    assert missing.returncode == 1 and "no airlock socket" in missing.stderr


def test_usage_errors_exit_2(ops: Stack) -> None:
    assert ops.cli("approve").returncode == 2
    assert ops.cli("hold").returncode == 2  # --reason is required
    assert ops.cli("token", "issue", "--session", "s", "--ttl", "soon").returncode == 2
    assert ops.cli("token", "revoke").returncode == 2
    assert ops.cli("frobnicate").returncode == 2


def test_daemon_errors_exit_1(ops: Stack) -> None:
    result = ops.cli("approve", "no-such-request")
    assert result.returncode == 1 and "not_found" in result.stderr
    as_json = ops.cli("approve", "no-such-request", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["error"]["code"] == "not_found"


def test_pending_approve_and_deny(ops: Stack) -> None:
    bg = ask(ops, ["echo", "from-cli"])
    listing = ops.cli("pending")
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[0].split() == ["ID", "USER", "AS", "LEFT", "COMMAND"]
    assert bg.request_id in listing.stdout and "echo from-cli" in listing.stdout
    line = next(ln for ln in listing.stdout.splitlines() if ln.startswith(f"{bg.request_id}: airlock approve "))
    assert line.split(": ", 1)[1].split()[2:4] == [bg.request_id, "--expect"]  # the line to paste
    approved = ops.cli(*line.split(": ", 1)[1].split()[1:], "--reason", "ok by me")
    assert approved.returncode == 0 and "approved" in approved.stdout
    assert bg.result()["ok"] is True

    bg = ask(ops)
    denied = ops.cli("deny", bg.request_id, "--reason", "no")
    assert denied.returncode == 0 and "denied" in denied.stdout
    assert bg.result()["error"]["code"] == "denied"
    assert ops.cli("pending").stdout.strip() == "no pending requests"


def test_show_prints_the_story(ops: Stack) -> None:
    bg = ask(ops, ["echo", "story"], reason="tell it")
    expect = wait_pending(ops, bg.request_id)["expect"]
    pending = ops.cli("show", bg.request_id)
    assert f"airlock approve {bg.request_id} --expect {expect}" in pending.stdout, pending.stdout
    ops.cli("approve", bg.request_id)
    bg.result()
    shown = ops.cli("show", bg.operation_id)
    assert shown.returncode == 0, shown.stderr
    for text in (
        bg.request_id,
        "finished",
        "tell it",
        "echo story",
        "approval.decided",
        "exec.finished",
        "ok, exit status 0",
    ):
        assert text in shown.stdout
    assert json.loads(ops.cli("show", bg.request_id, "--json").stdout)["data"]["request_id"] == bg.request_id
    assert ops.cli("show", "nothing-like-this").returncode == 1


def test_cancel(ops: Stack) -> None:
    bg = ask(ops)
    result = ops.cli("cancel", bg.operation_id, "--reason", "changed my mind")
    assert result.returncode == 0 and "pending" in result.stdout
    assert bg.result()["error"]["code"] == "denied"
    assert ops.cli("cancel", "op-not-running").returncode == 1


def test_hold_and_release(ops: Stack) -> None:
    held = ops.cli("hold", "--reason", "maintenance")
    assert held.returncode == 0 and "hold" in held.stdout
    shown = ops.cli("status").stdout
    assert re.search(r"on hold by \S+ since \d{4}-\d\d-\d\dT[\d:]+Z \(maintenance\)", shown), shown
    released = ops.cli("release")
    assert released.returncode == 0 and "accepting" in ops.cli("status").stdout


def test_events_tail_after_and_follow(ops: Stack) -> None:
    ran = ops.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-cli-ev-{time.time()}"})
    tail = ops.cli("events", "--tail", "3")
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 3
    # Who and what (issue 32): the exec.started line names the user and the command.
    me = pwd.getpwuid(os.getuid()).pw_name
    story = ops.cli("events", "--tail", "12").stdout.splitlines()
    started = [line for line in story if " exec.started " in line and ran["id"] in line]
    assert started and f" {me} " in started[0] and "COMMAND=/usr/bin/true" in started[0], story
    # Issue 44: a service's start and stop say which service (the journal's own and the others').
    first = ops.cli("events", "--after", "0", "--limit", "64").stdout.splitlines()
    services = [line for line in first if " service.started " in line]
    assert any("airlock-journal started ; PID=" in line for line in services), first
    assert any("airlock-approval started ; PID=" in line for line in services), first
    page = json.loads(ops.cli("events", "--after", "0", "--limit", "2", "--json").stdout)
    assert len(page["data"]["events"]) == 2 and page["data"]["next_cursor"] == page["data"]["events"][-1]["seq"]
    assert ops.cli("events", "--limit", "300").returncode == 1

    environ = dict(os.environ) | {"AIRLOCK_OPERATOR_SOCKET": ops.operator}
    follower = subprocess.Popen(
        [sys.executable, "-m", "airlock", "events", "--follow", "--tail", "0", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env=environ,
    )
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())
        assert first["ok"] is True and first["data"]["events"] == []
        reply = ops.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-follow-{time.time()}"})
        seen: list[dict[str, object]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e.get("kind") == "request.replied" for e in seen):
            envelope = json.loads(follower.stdout.readline())
            assert envelope["ok"] is True
            seen += [e for e in envelope["data"]["events"] if e["request_id"] == reply["id"]]
        assert seen[0]["kind"] == "request.received"
        assert any(e["kind"] == "request.replied" for e in seen)
    finally:
        follower.terminate()
        follower.wait(10)


def test_token_issue_and_revoke(ops: Stack) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    issued = ops.cli("token", "issue", "--session", "ci", "--user", me, "--ttl", "2m")
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()
    assert token.startswith("alt_") and "session ci" in issued.stderr and me in issued.stderr
    reply = ops.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-tok-{time.time()}"}, token=token)
    assert reply["ok"] is True
    run = ops.cli(
        "run",
        "--no-privilege",
        "--json",
        "--operation-id",
        f"op-tok-run-{time.time()}",
        "--",
        "true",
        env={"AIRLOCK_TOKEN": token},
    )
    assert run.returncode == 0, run.stderr
    shown = json.loads(ops.cli("show", json.loads(run.stdout)["id"], "--json").stdout)
    assert shown["data"]["session"] == "ci"
    bad = ops.cli("run", "--no-privilege", "--", "true", env={"AIRLOCK_TOKEN": "alt_bogus"})
    assert bad.returncode == 125 and "unauthorized" in bad.stderr
    revoked = ops.cli("token", "revoke", token)
    assert revoked.returncode == 0 and "revoked 1" in revoked.stdout
    ops.cli("token", "issue", "--session", "ci2", "--user", me)
    assert "revoked 1" in ops.cli("token", "revoke", "--session", "ci2").stdout
    envelope = json.loads(ops.cli("token", "issue", "--session", "ci3", "--user", me, "--ttl", "90", "--json").stdout)
    assert envelope["data"]["session"] == "ci3"


def test_wait_exits_0_only_when_it_ran_and_exited_0(ops: Stack) -> None:
    ok = Background(ops, {"argv": ["true"]})
    waited = ops.cli("wait", ok.operation_id, "--timeout", "20")
    assert waited.returncode == 0 and "finished (ok, exit status 0)" in waited.stdout, waited.stdout
    ok.result()

    failing = Background(ops, {"command": "exit 3"})
    # Pending (shell form asks): wait blocks until an operator decides.
    waiter = subprocess.Popen(
        [sys.executable, "-m", "airlock", "wait", failing.operation_id, "--timeout", "30"],
        env=dict(os.environ) | {"AIRLOCK_OPERATOR_SOCKET": ops.operator},
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)  # not a wait: a window in which a wait that did not block would have exited
    assert waiter.poll() is None
    wait_pending(ops, failing.request_id)
    ops.cli("approve", failing.request_id)
    assert waiter.wait(30) == 1
    assert waiter.stdout is not None and "(ok, exit status 3)" in waiter.stdout.read()
    assert failing.result()["data"]["stages"][0]["exit_code"] == 3

    denied = ask(ops)
    ops.cli("deny", denied.request_id)
    denied.result()
    assert ops.cli("wait", denied.operation_id, "--timeout", "10").returncode == 1

    pending = ask(ops)
    started = time.monotonic()
    assert ops.cli("wait", pending.operation_id, "--timeout", "1").returncode == 1
    assert time.monotonic() - started < 10
    ops.cli("deny", pending.request_id)
    pending.result()


def test_policy_check_and_audit_commands(ops: Stack) -> None:
    check = ops.cli("policy", "check", "--no-privilege", "--", "true")
    assert check.returncode == 0 and "decision: allow (rule allow-true)" in check.stdout
    verify = ops.cli("audit", "verify")
    assert verify.returncode == 0 and verify.stdout.startswith("ok:")
    head = ops.cli("audit", "head", "--json")
    assert head.returncode == 0 and len(json.loads(head.stdout)["data"]["hash"]) == 64


def test_no_color_and_a_terminal(ops: Stack) -> None:
    from airlock.common.render import use_colour

    class Tty:
        def isatty(self) -> bool:
            return True

    saved = {k: os.environ.get(k) for k in ("NO_COLOR", "TERM")}
    try:
        os.environ["TERM"] = "xterm"
        os.environ.pop("NO_COLOR", None)
        assert use_colour(Tty()) is True  # type: ignore[arg-type]
        os.environ["NO_COLOR"] = "1"
        assert use_colour(Tty()) is False  # type: ignore[arg-type]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
