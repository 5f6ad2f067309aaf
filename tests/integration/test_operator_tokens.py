"""Issue 8: session tokens (issue, use, expiry, revocation, require_token), the notify hook,
self-approval refused, and the runner refusing `exec` from anyone but intake."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pwd
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_support import Background, ask, stack_with, wait_pending

from support import Stack, now_iso

UNAUTHORIZED = {"code": "unauthorized", "message": "unauthorized", "details": {}}


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp("tk"))
    hook = tmp / "hook.sh"
    hook.write_text('#!/bin/sh\ncat > "$(dirname "$0")/notified-$AIRLOCK_REQUEST_ID.json"\necho hook-ran\n')
    hook.chmod(0o755)
    extra = f"""
agents:
  require_token: true
approval:
  allow_self_approval: false
  timeout_seconds: 20
  notify_command: [{hook}]
  notify_timeout_seconds: 5
"""
    yield from stack_with(tmp, extra)


def op(stack: Stack, verb: str, args: dict[str, Any] | None = None, **envelope: Any) -> dict[str, Any]:
    return stack.native(verb, args, path=stack.operator, **envelope)


def issue(stack: Stack, session: str, ttl: float = 600) -> str:
    user = pwd.getpwuid(os.getuid()).pw_name
    reply = op(stack, "token.issue", {"session": session, "user": user, "ttl_seconds": ttl, "reason": "test"})
    assert reply["ok"] is True, reply
    token: str = reply["data"]["token"]
    return token


def test_issue_returns_the_token_session_and_expiry_and_journals_only_a_hash(strict: Stack) -> None:
    reply = op(strict, "token.issue", {"session": "nightly", "user": "root", "ttl_seconds": 120})
    data = reply["data"]
    assert data["session"] == "nightly" and data["token"].startswith("alt_")
    assert data["expires_at"].endswith("Z")
    rows = [r for r in strict.journal_rows() if r["kind"] == "operator.action"]
    issued = [json.loads(r["payload"]) for r in rows if json.loads(r["payload"])["action"] == "token.issue"]
    assert issued[-1]["token_id"] == data["token_id"]
    assert not any(data["token"] in json.dumps(dict(r)) for r in strict.journal_rows())
    assert not any(data["token"] in p.read_text() for p in (strict.runtime_dir / "logs").glob("*.log"))


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"session": "", "user": "root"},
        {"session": "s"},
        {"session": "s", "user": ""},
        {"session": "s", "user": "no-such-user-here"},
        {"session": "s", "user": "root", "ttl_seconds": 0},
        {"session": "s", "user": "root", "ttl_seconds": "1h"},
        {"session": "s", "user": "root", "ttl_seconds": 10**9},
    ],
)
def test_issue_checks_its_arguments(strict: Stack, args: dict[str, Any]) -> None:
    assert op(strict, "token.issue", args)["error"]["code"] == "invalid_arguments"


def test_a_valid_token_runs_in_its_session_and_another_session_is_refused(strict: Stack) -> None:
    token = issue(strict, "nightly")
    reply = strict.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-t-{time.time()}"}, token=token)
    assert reply["ok"] is True, reply
    rows = [r for r in strict.journal_rows() if r["request_id"] == reply["id"]]
    assert {r["session"] for r in rows} == {"nightly"}
    same = strict.exec(
        {"argv": ["true"], "privileged": False, "session": "nightly", "operation_id": f"op-t2-{time.time()}"},
        token=token,
    )
    assert same["ok"] is True, same
    forged = strict.exec(
        {"argv": ["true"], "privileged": False, "session": "forged", "operation_id": f"op-t3-{time.time()}"},
        token=token,
    )
    assert forged["error"]["code"] == "invalid_arguments" and forged["error"]["details"] == {"field": "session"}
    assert not [r for r in strict.journal_rows() if r["request_id"] == forged["id"]]


def test_require_token_refuses_requests_without_one_in_both_dialects(strict: Stack) -> None:
    assert strict.exec({"argv": ["true"], "privileged": False})["error"] == UNAUTHORIZED
    assert strict.native("ping")["error"] == UNAUTHORIZED
    legacy = strict.send_raw(
        json.dumps({"id": "lg1", "time": now_iso(), "pipeline": [["true"]], "privileged": False}).encode() + b"\n"
    )
    assert legacy[0]["status"] == "error" and legacy[0]["code"] == "unauthorized"


def test_wrong_expired_and_revoked_tokens_get_the_same_refusal(strict: Stack) -> None:
    def attempt(token: str | None) -> dict[str, Any]:
        reply = strict.exec({"argv": ["true"], "privileged": False, "operation_id": f"op-x-{time.time()}"}, token=token)
        return {k: v for k, v in reply.items() if k != "id"}

    missing = attempt(None)
    assert missing == {"ok": False, "error": UNAUTHORIZED}
    assert attempt("alt_" + "A" * 43) == missing
    assert attempt("x" * 300) == missing
    short = issue(strict, "brief", ttl=1)
    assert attempt(short)["ok"] is True
    time.sleep(1.2)  # the behaviour under test: its one-second life passes
    assert attempt(short) == missing  # expired

    one = issue(strict, "revoke-me")
    assert op(strict, "token.revoke", {"token": one})["data"]["revoked"] == 1
    assert attempt(one) == missing
    assert op(strict, "token.revoke", {"token": one})["data"]["revoked"] == 0

    a, b = issue(strict, "whole-session"), issue(strict, "whole-session")
    assert op(strict, "token.revoke", {"session": "whole-session", "reason": "rotated"})["data"]["revoked"] == 2
    assert attempt(a) == missing and attempt(b) == missing


def test_revoke_needs_exactly_one_of_token_and_session(strict: Stack) -> None:
    assert op(strict, "token.revoke", {})["error"]["code"] == "invalid_arguments"
    assert op(strict, "token.revoke", {"token": "t", "session": "s"})["error"]["code"] == "invalid_arguments"


def test_the_token_check_verb_is_not_on_the_operator_socket(strict: Stack) -> None:
    assert op(strict, "token.check", {"token": "t"})["error"]["code"] == "unknown_verb"


def test_status_counts_live_tokens(strict: Stack) -> None:
    before = op(strict, "status")["data"]["tokens"]
    issue(strict, "counted")
    assert op(strict, "status")["data"]["tokens"] == before + 1


# --- self-approval, notify -------------------------------------------------------------


def test_self_approval_is_refused_when_not_allowed_but_deny_works(strict: Stack) -> None:
    token = issue(strict, "self")
    bg = Background(strict, {"argv": ["echo", "self"]}, token=token)
    wait_pending(strict, bg.request_id)
    refused = op(strict, "approve", {"id": bg.request_id})
    assert refused["error"]["code"] == "unauthorized"
    assert "own" in refused["error"]["message"]
    assert op(strict, "deny", {"id": bg.request_id})["ok"] is True
    assert bg.result()["error"]["code"] == "denied"


def test_the_notify_hook_gets_the_pending_request_on_stdin(strict: Stack) -> None:
    token = issue(strict, "notify")
    bg = Background(strict, {"argv": ["echo", "notify-me"], "reason": "page someone"}, token=token)
    wait_pending(strict, bg.request_id)
    target = strict.runtime_dir / f"notified-{bg.request_id}.json"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (target.exists() and target.read_text().endswith("\n")):
        time.sleep(0.05)
    body = json.loads(target.read_text())
    assert body["event"] == "pending" and body["request_id"] == bg.request_id
    assert body["reason"] == "page someone" and body["session"] == "notify"
    assert body["stages"][0]["argv"] == ["echo", "notify-me"]
    op(strict, "deny", {"id": bg.request_id})
    bg.result()
    log = (strict.runtime_dir / "logs" / "approval.log").read_text()
    assert "approval.notify.finished" in log and "hook-ran" in log


def test_a_failing_or_hanging_hook_never_blocks_a_decision(tmp_path: Path) -> None:
    hook = tmp_path / "hang.sh"
    hook.write_text("#!/bin/sh\necho about to hang >&2\nsleep 60\n")
    hook.chmod(0o755)
    extra = f"approval:\n  notify_command: [{hook}]\n  notify_timeout_seconds: 1\n"
    for stack in stack_with(tmp_path, extra):
        bg = ask(stack)
        assert op(stack, "approve", {"id": bg.request_id})["ok"] is True
        assert bg.result()["ok"] is True
        deadline = time.monotonic() + 10
        log = stack.runtime_dir / "logs" / "approval.log"
        while time.monotonic() < deadline and "approval.notify.timed_out" not in log.read_text():
            time.sleep(0.1)
        assert "approval.notify.timed_out" in log.read_text()


# --- the runner's exec belongs to intake alone ------------------------------------------


def test_runner_exec_refuses_a_peer_that_is_not_intake() -> None:
    from airlock.common import config as configuration
    from airlock.common.codec import Request
    from airlock.common.errors import AirlockError
    from airlock.common.peer import identify
    from airlock.common.server import Call
    from airlock.runner.fileop_verbs import FileVerbs
    from airlock.runner.passkeys import PasskeyWriter
    from airlock.runner.service import Runner

    defaults = configuration.defaults()
    cfg = dataclasses.replace(
        defaults,
        services=dataclasses.replace(
            defaults.services, intake_user=str(os.getuid() + 1), approval_user=str(os.getuid())
        ),
    )
    runner = Runner(cfg)
    door = runner.door(FileVerbs(runner), PasskeyWriter(cfg))  # the door as the service serves it
    me = identify(os.getpid(), os.getuid(), os.getgid())

    async def served(verb: str) -> dict[str, Any]:
        return await door.verbs[verb](Call(Request(id="r", verb=verb, args={}), me, None))  # type: ignore[arg-type]

    for verb in ("exec", "files"):
        with pytest.raises(AirlockError) as caught:
            asyncio.run(served(verb))
        assert caught.value.code.value == "unauthorized"
    # Control: the same peer is approval here, and reaches approval's verbs (refused for its arguments only).
    with pytest.raises(AirlockError) as caught:
        asyncio.run(served("cancel"))
    assert caught.value.code.value == "invalid_arguments"


def test_the_example_notify_script_summarises_a_pending_request() -> None:
    import subprocess

    from support import REPO

    body = {
        "request_id": "r1",
        "peer": {"user": "dev"},
        "stages": [{"argv": ["systemctl", "restart", "nginx"]}],
        "privileged": True,
        "reason": "deploy",
    }
    result = subprocess.run(
        [str(REPO / "config" / "notify-example.sh")],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "AIRLOCK_REQUEST_ID": "r1"},
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "dev wants to run 'systemctl restart nginx' as root: 'deploy'" in result.stdout


def test_a_restart_of_approval_revokes_every_token(tmp_path: Path) -> None:
    import signal

    for stack in stack_with(tmp_path, "agents:\n  require_token: true\n"):
        token = issue(stack, "survivor?")
        assert (
            stack.exec({"argv": ["true"], "privileged": False, "operation_id": "op-before"}, token=token)["ok"] is True
        )
        pid = op(stack, "status")["data"]["services"]["approval"]["pid"]
        os.kill(pid, signal.SIGKILL)  # `airlock dev up` starts it again, as systemd would
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                reply = op(stack, "status")
                if reply["ok"] and reply["data"]["services"]["approval"]["pid"] != pid:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert op(stack, "status")["data"]["tokens"] == 0
        after = stack.exec({"argv": ["true"], "privileged": False, "operation_id": "op-after"}, token=token)
        assert after["error"] == UNAUTHORIZED
