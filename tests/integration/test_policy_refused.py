"""A refused policy never takes approval down (issue 44): the last accepted copy decides, or a person.

approval keeps the policy it accepted in its state directory.  Restarted on files it refuses (a
typo written while it was idle), it serves on that copy, or, with none, asks a person for every
request, and it says so in `status`, `pending`, `can` and the audit chain.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Background, Stack, custom_stack, wait_pending

CONFIG = """
approval:
  timeout_seconds: 30
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
TYPO = "rules:\n  - name: typo\n    decision: allow\n    comands: [[/usr/bin/id]]\n"


@pytest.fixture(scope="module")
def pstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("pr")), CONFIG) as s:
        yield s


def _restart_approval(stack: Stack) -> None:
    """SIGTERM approval; dev up starts it again (as the socket would on the next request)."""
    pid = stack.service_pid("approval")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            # A clean exit is an idle one for dev up: the next connection starts it again.
            if stack.native("status", path=stack.operator).get("ok") and stack.service_pid("approval") != pid:
                return
        except (OSError, AssertionError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError("approval did not come back")


def _typo(stack: Stack) -> Path:
    dropin = stack.runtime_dir / "policy.d" / "60-typo.yaml"
    dropin.parent.mkdir(exist_ok=True)
    dropin.write_text(TYPO)
    return dropin


def test_a_typo_made_while_approval_is_down_keeps_the_last_accepted_policy(pstack: Stack) -> None:
    dropin = _typo(pstack)
    try:
        _restart_approval(pstack)
        # Control: the kept policy still decides what the accepted one decided, both ways.
        allowed = pstack.exec({"argv": ["echo", "hi"], "privileged": False})
        assert allowed["ok"] is True, allowed
        denied = pstack.exec({"argv": ["dd", "if=/dev/zero", "of=/dev/null", "count=1"], "privileged": False})
        assert denied["error"]["details"]["rule"] == "never-dd"
        status = pstack.cli("status")
        assert status.returncode == 0, status.stderr
        assert "REFUSED" in status.stdout and "60-typo.yaml:4:5" in status.stdout, status.stdout
        assert "the policy accepted at" in status.stdout, status.stdout
        rejected = [r for r in pstack.journal_rows() if r["kind"] == "policy.rejected"]
        assert rejected and json.loads(rejected[-1]["payload"])["mode"] == "last-good", rejected
        assert any("60-typo.yaml:4:5" in e for e in json.loads(rejected[-1]["payload"])["refused"])
        can = pstack.cli("can", "--no-privilege", "--", "echo", "x")
        assert "policy files on disk were refused" in can.stdout, can.stdout
        pending = pstack.cli("pending")
        assert pending.stdout.startswith("policy: the policy files on disk were refused"), pending.stdout
    finally:
        dropin.unlink()
    _restart_approval(pstack)
    status = pstack.cli("status")
    assert "REFUSED" not in status.stdout, status.stdout


def test_a_refused_reload_says_so_everywhere_and_keeps_the_policy(pstack: Stack) -> None:
    dropin = _typo(pstack)
    before = len([r for r in pstack.journal_rows() if r["kind"] == "policy.rejected"])
    try:
        os.kill(pstack.service_pid("approval"), signal.SIGHUP)
        deadline = time.monotonic() + 20
        while len([r for r in pstack.journal_rows() if r["kind"] == "policy.rejected"]) == before:
            assert time.monotonic() < deadline, "no policy.rejected record after a refused reload"
            time.sleep(0.2)
        assert pstack.exec({"argv": ["true"], "privileged": False})["ok"] is True
        assert "REFUSED" in pstack.cli("status").stdout
        check = pstack.cli("policy", "check", "--files", str(dropin.parent))
        assert check.returncode == 1 and "60-typo.yaml:4:5" in check.stderr, check
    finally:
        dropin.unlink()
        os.kill(pstack.service_pid("approval"), signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "REFUSED" in pstack.cli("status").stdout:
        assert time.monotonic() < deadline, "a good reload did not clear the refusal"
        time.sleep(0.2)


def test_with_no_accepted_copy_every_request_asks_a_person(pstack: Stack) -> None:
    kept = pstack.runtime_dir / "state" / "approval" / "policy.last-good.json"
    assert kept.exists(), "approval keeps the policy it accepted"
    saved = kept.read_bytes()
    dropin = _typo(pstack)
    try:
        kept.unlink()
        _restart_approval(pstack)
        status = pstack.cli("status")
        assert "every request asks a person" in status.stdout, status.stdout
        # What the rules allowed at once now waits for a person; what they denied is asked too, never run.
        job = Background(pstack, {"argv": ["echo", "closed"], "privileged": False})
        wait_pending(pstack, job.request_id)
        assert pstack.cli("deny", job.request_id, "--reason", "closed mode").returncode == 0
        assert job.result()["error"]["code"] == "denied"
    finally:
        dropin.unlink()
        if not kept.exists():
            kept.write_bytes(saved)
        shutil.rmtree(pstack.runtime_dir / "policy.d" / "__pycache__", ignore_errors=True)
    _restart_approval(pstack)
    assert pstack.exec({"argv": ["echo", "hi"], "privileged": False})["ok"] is True
