"""Decisions over time: ask -> approve / deny / timeout, hold and release, restarts (issue 6)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Background, Stack, custom_stack, wait_pending
from waits import wait_log_events

CONFIG = """
approval:
  timeout_seconds: 4
policy:
  default: ask
  rules:
    - name: harmless
      decision: allow
      privileged: false
      commands: [[/usr/bin/true], [/usr/bin/echo, "..."]]
    - name: never-dd
      decision: deny
      commands: [[/usr/bin/dd, "..."]]
"""


@pytest.fixture(scope="module")
def astack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("ap")), CONFIG) as s:
        yield s


def test_allow_and_deny_rules_decide_at_once(astack: Stack) -> None:
    assert astack.exec({"argv": ["echo", "hi"], "privileged": False})["ok"] is True
    denied = astack.exec({"argv": ["dd", "if=/dev/zero", "of=/dev/null", "count=1"], "privileged": False})
    assert denied["error"]["code"] == "denied" and denied["error"]["details"]["rule"] == "never-dd"


def test_ask_then_an_operator_approves(astack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "approved"
    job = Background(astack, {"argv": ["touch", str(marker)], "privileged": False, "reason": "needs a file"})
    wait_pending(astack, job.request_id)
    result = astack.cli("approve", job.request_id, "--reason", "looks fine")
    assert result.returncode == 0, result.stderr
    assert job.result()["ok"] is True and marker.exists()
    rows = [r for r in astack.journal_rows() if r["request_id"] == job.request_id]
    kinds = [r["kind"] for r in rows]
    assert (
        kinds.index("approval.pending")
        < kinds.index("operator.action")
        < kinds.index("approval.decided")
        < kinds.index("exec.started")
    )


def test_ask_then_an_operator_denies(astack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "denied"
    job = Background(astack, {"argv": ["touch", str(marker)], "privileged": False})
    wait_pending(astack, job.request_id)
    # Issue 27: not a prefix (without a terminal nobody reads back what it found), the whole ID.
    assert astack.cli("deny", job.request_id[:12], "--reason", "not today").returncode == 1
    assert astack.cli("deny", job.request_id, "--reason", "not today").returncode == 0
    reply = job.result()
    assert reply["error"]["code"] == "denied" and "not today" in reply["error"]["message"]
    assert not marker.exists()


def test_ask_then_nobody_decides(astack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "timeout"
    started = time.monotonic()
    reply = astack.exec({"argv": ["touch", str(marker)], "privileged": False})
    assert reply["error"]["code"] == "approval_timeout"
    assert 3.5 < time.monotonic() - started < 15
    assert not marker.exists()


def test_hold_makes_even_allowed_requests_wait_and_release_lifts_it(astack: Stack) -> None:
    assert astack.cli("hold", "--reason", "incident 42").returncode == 0
    status = astack.native("status", path=astack.operator)["data"]
    assert status["hold"] is True and status["hold_reason"] == "incident 42"
    job = Background(astack, {"argv": ["true"], "privileged": False})
    wait_pending(astack, job.request_id)
    released = astack.cli("release")
    assert released.returncode == 0 and job.request_id in released.stdout  # its rule allows it: it runs now
    assert job.result()["ok"] is True
    assert astack.exec({"argv": ["true"], "privileged": False})["ok"] is True  # released: the rule decides again


def test_policy_check_explains_without_running(astack: Stack) -> None:
    result = astack.cli("policy", "check", "--no-privilege", "--", "dd", "if=/dev/zero")
    assert result.returncode == 0, result.stderr
    assert "deny" in result.stdout and "never-dd" in result.stdout and "/usr/bin/dd" in result.stdout


def test_a_broken_policy_on_reload_is_rejected_and_the_old_one_stays(astack: Stack) -> None:
    config = astack.runtime_dir / "airlock.yaml"
    original = config.read_text()
    pid = astack.service_pid("approval")
    try:
        config.write_text(original.replace("decision: deny", "decision: maybe"))
        os.kill(pid, signal.SIGHUP)
        rejected = wait_log_events(astack.runtime_dir / "logs", "approval.policy.rejected")
        assert "maybe" in json.dumps(rejected)
        denied = astack.exec({"argv": ["dd", "if=/dev/zero", "of=/dev/null", "count=1"], "privileged": False})
        assert denied["error"]["details"]["rule"] == "never-dd"
    finally:
        config.write_text(original)


def test_a_pending_request_fails_cleanly_when_approval_restarts(astack: Stack) -> None:
    job = Background(astack, {"argv": ["ls"], "privileged": False})
    wait_pending(astack, job.request_id)
    pid = astack.service_pid("approval")
    os.kill(pid, signal.SIGTERM)
    assert job.result()["error"]["code"] == "approval_interrupted"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # dev up starts it again
        try:
            if astack.native("status", path=astack.operator).get("ok"):
                break
        except OSError:
            pass
        time.sleep(0.3)
    assert astack.exec({"argv": ["true"], "privileged": False})["ok"] is True


def test_a_killed_approval_interrupts_pending_requests_too(astack: Stack) -> None:
    job = Background(astack, {"argv": ["ls"], "privileged": False})
    wait_pending(astack, job.request_id)
    pid = astack.service_pid("approval")
    os.kill(pid, signal.SIGKILL)
    assert job.result()["error"]["code"] == "approval_interrupted"
