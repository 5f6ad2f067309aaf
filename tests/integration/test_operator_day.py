"""Issue 32: the operator's day -- timeouts that mean what they say, and what a waiting agent is told."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_support import Background, Stack, ask, stack_with, wait_pending

from support import custom_stack, now_iso


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from stack_with(Path(tmp_path_factory.mktemp("day")), "approval:\n  timeout_seconds: 2\n")


def reload_approval(stack: Stack, old: str, new: str) -> None:
    config = stack.runtime_dir / "airlock.yaml"
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))
    pid = stack.service_pid("approval")
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while not [
        r for r in stack.journal_rows() if r["kind"] == "policy.reloaded" and "approval.timeout_seconds" in r["payload"]
    ]:
        assert time.monotonic() < deadline, "approval did not reload"
        time.sleep(0.05)


def test_a_reloaded_approval_timeout_is_the_one_a_waiting_agent_gets(day: Stack) -> None:
    """Raised from 2 s to 45 s by `systemctl reload` (SIGHUP): the agent is told 45 s and waits past
    what intake used to allow itself (its own stale copy, 2 + 30 s), until an operator approves."""
    reload_approval(day, "timeout_seconds: 2", "timeout_seconds: 45")
    request_id = f"late-{uuid.uuid4()}"
    args = {"argv": ["echo", "late"], "privileged": False, "time": now_iso(), "stream": True}
    line = {"v": 1, "id": request_id, "verb": "exec", "args": args}
    replies: list[list[dict[str, Any]]] = []
    waiter = threading.Thread(
        target=lambda: replies.append(day.send_raw(json.dumps(line).encode() + b"\n", timeout=90))
    )
    waiter.start()
    item = wait_pending(day, request_id)
    assert 40 < item["seconds_left"] <= 45, item
    time.sleep(33)  # past 2 + 30: the old intake cut the wait here with approval_interrupted
    assert wait_pending(day, request_id, timeout=2)["request_id"] == request_id
    assert day.native("approve", {"id": request_id}, path=day.operator)["ok"] is True
    waiter.join(30)
    events = replies[0]
    told = [e for e in events if e.get("event") == "pending_approval"]
    assert told and told[0]["timeout_seconds"] == 45, events
    assert events[-1]["ok"] is True, events[-1]


def test_the_waiting_message_names_the_request_and_the_approve_command(day: Stack) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "airlock", "run", "--no-privilege", "--socket", str(day.agent), "--", "echo", "w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    proc.kill()
    proc.wait(10)
    assert line.startswith("airlock: waiting for an operator to approve request "), line
    request_id = line.split("request ", 1)[1].split(" ", 1)[0]
    assert "s left" in line and f"an operator approves it with: airlock approve {request_id}" in line, line


def run_cli(stack: Stack, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "airlock", *argv], capture_output=True, text=True, timeout=60)


def test_a_missing_program_is_command_not_found_with_exit_127(day: Stack) -> None:
    """`airlock run -- sytemctl ...` used to say `denied by policy rule 'unresolved'`: a typo is no policy decision."""
    for argv in (["run", "--socket", str(day.agent), "--no-privilege", "--", "sytemctl", "restart", "nginx"],):
        done = run_cli(day, *argv)
        assert done.returncode == 127, done
        assert "command_not_found: sytemctl: command not found" in done.stderr and "/usr/bin" in done.stderr, done
    reply = day.exec({"argv": ["sytemctl"], "privileged": False})
    assert reply["error"]["code"] == "command_not_found" and reply["error"]["details"]["program"] == "sytemctl"
    decided = [r for r in day.journal_rows() if r["request_id"] == reply["id"] and r["kind"] == "approval.decided"]
    assert decided and '"unresolved"' in decided[0]["payload"]  # still journaled as the policy's refusal


def test_durations_take_units_everywhere(day: Stack) -> None:
    done = run_cli(day, "run", "--socket", str(day.agent), "--no-privilege", "--timeout", "5m", "--", "true")
    assert done.returncode == 0, done
    bad = run_cli(day, "run", "--socket", str(day.agent), "--no-privilege", "--timeout", "5 fortnights", "--", "true")
    assert bad.returncode == 2 and "not a duration" in bad.stderr, bad


def test_the_wrong_socket_is_named_with_the_right_one(day: Stack) -> None:
    run = run_cli(day, "run", "--socket", str(day.operator), "--no-privilege", "--", "true")
    assert run.returncode == 125 and "is not an agent socket" in run.stderr and "agent.sock" in run.stderr, run
    pending = run_cli(day, "pending", "--socket", str(day.agent))
    assert pending.returncode == 1 and "is the agent socket; operator commands use operator.sock" in pending.stderr


def test_root_is_told_why_it_is_refused(tmp_path: Path) -> None:
    """Root is no agent on an installed box (agents.groups: [airlock]); it used to read `unauthorized: unauthorized`."""
    for stack in stack_with(tmp_path / "rt", "agents:\n  users: [nobody]\n"):
        reply = stack.exec({"argv": ["true"], "privileged": False})
        if os.geteuid() == 0:
            assert reply["error"]["code"] == "unauthorized" and "root is not an agent here" in reply["error"]["message"]
            # the CLI prints "code: message": the message must not say the code again
            assert reply["error"]["message"].startswith("root is not an agent here"), reply
        else:
            assert reply["error"]["message"] == "unauthorized"  # anyone else learns nothing


def test_the_runner_log_says_who_ran_what_in_one_line(day: Stack) -> None:
    """`journalctl -u airlock-runner` alone answers "who ran what": under dev up the same events are JSON lines."""
    reply = day.exec({"argv": ["true"], "privileged": False})  # allowed by the stack's policy
    assert reply["ok"] is True, reply
    me = pwd.getpwuid(os.getuid()).pw_name
    lines = [json.loads(line) for line in (day.runtime_dir / "logs" / "runner.log").read_text().splitlines()]
    said = {line["kind"]: line.get("message") for line in lines if line.get("request_id") == reply["id"]}
    started = said["exec.started"]
    assert started.startswith(f"{me} : USER={me} ; CWD=/"), started
    assert started.endswith(f" ; COMMAND=/usr/bin/true ; REQUEST={reply['id']}"), started
    assert said["exec.finished"].startswith(f"{me} : finished ; EXIT=0 ; TOOK=")


def test_a_rule_for_a_user_or_group_that_does_not_exist_is_warned_about(tmp_path: Path) -> None:
    """A typo in a rule's group loaded without a word before (issue 32); now it loads with a warning."""
    policy = """policy:
  default: ask
  rules:
    - name: typo
      decision: allow
      groups: [agentz]
      users: [nosuchuser-xyz]
      commands: [[/usr/bin/true]]
"""
    with custom_stack(tmp_path / "rt", policy) as stack:
        log = (stack.runtime_dir / "logs" / "approval.log").read_text()
        assert "approval.policy.warning" in log and "no group 'agentz' on this host" in log, log
        assert "no user 'nosuchuser-xyz' on this host" in log
        check = run_cli(stack, "policy", "check", "--socket", str(stack.operator), "--no-privilege", "--", "true")
        assert check.returncode == 0 and "policy warning:" in check.stderr and "agentz" in check.stderr, check


def test_an_agent_can_ask_what_it_may_run(tmp_path: Path) -> None:
    """Issue 32: agents had no `sudo -l`; `airlock can` explains the decision for the caller's own request."""
    policy = """policy:
  default: ask
  rules:
    - name: true-is-fine
      decision: allow
      privileged: false
      description: harmless
      commands: [[/usr/bin/true]]
    - name: no-rm
      decision: deny
      commands: [[/usr/bin/rm, "..."]]
    - name: someone-elses
      decision: allow
      users: [nobody]
      commands: [[/usr/bin/echo, "..."]]
"""
    with custom_stack(tmp_path / "rt", policy) as stack:
        base = ["can", "--socket", str(stack.agent), "--no-privilege", "--"]
        allowed = run_cli(stack, *base, "true")
        assert allowed.returncode == 0, allowed
        assert "rule true-is-fine (harmless)" in allowed.stdout and "run it at once" in allowed.stdout
        asks = run_cli(stack, *base, "echo", "hi")
        assert asks.returncode == 1 and "the policy's default" in asks.stdout, asks
        assert "someone-elses" not in asks.stdout  # another user's rule is not shown
        refused = run_cli(stack, *base, "rm", "-rf", "/nonexistent-x")
        assert refused.returncode == 126 and "rule no-rm" in refused.stdout, refused
        missing = run_cli(stack, *base, "sytemctl")
        assert missing.returncode == 127 and "command not found" in missing.stdout, missing
        # Nothing ran and nothing was journaled for any of these.
        assert not [r for r in stack.journal_rows() if r["kind"] in ("request.received", "exec.started")]


def test_release_redecides_held_requests_at_once(tmp_path: Path) -> None:
    """Issue 32: an allowed command held by `hold` stayed pending under rule `hold` after `release`."""
    rule = "{name: ok, decision: allow, privileged: false, commands: [[/usr/bin/true]]}"
    with custom_stack(tmp_path / "rt", f"policy:\n  default: ask\n  rules:\n    - {rule}\n") as stack:
        assert stack.native("hold", {"reason": "maintenance"}, path=stack.operator)["ok"] is True
        held = Background(stack, {"argv": ["true"]})
        asks = Background(stack, {"argv": ["echo", "still-asks"]})
        assert wait_pending(stack, held.request_id)["rule"] == "hold"
        wait_pending(stack, asks.request_id)
        released = stack.native("release", {}, path=stack.operator)
        assert released["ok"] is True and released["data"]["released"] == [held.request_id], released
        assert held.result()["ok"] is True  # ran, without an operator
        pending = [p["request_id"] for p in stack.native("pending", path=stack.operator)["data"]["pending"]]
        assert pending == [asks.request_id]  # its rule asks: it still waits for an operator
        decided = [
            r for r in stack.journal_rows() if r["request_id"] == held.request_id and r["kind"] == "approval.decided"
        ]
        assert decided and "release by" in decided[0]["payload"]


# --- found walking the docs on a fresh Debian 12 (issue 32's last "Done when") ---------------------------


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from stack_with(Path(tmp_path_factory.mktemp("walk")))


def test_an_operators_decision_says_in_journald_who_decided_what_as_whom(walk: Stack) -> None:
    """It read `deploy : allow by alice ; COMMAND=? ; ...`: approval's record of an operator's
    decision carried neither the command nor whom it runs as."""
    bg = ask(walk, ["echo", "walked"], privileged=False)
    assert walk.native("deny", {"id": bg.request_id, "reason": "not now"}, path=walk.operator)["ok"] is True
    assert bg.result()["error"]["code"] == "denied"
    me = pwd.getpwuid(os.getuid()).pw_name
    lines = [json.loads(line) for line in (walk.runtime_dir / "logs" / "approval.log").read_text().splitlines()]
    said = [
        line.get("message")
        for line in lines
        if line.get("request_id") == bg.request_id and line.get("kind") == "approval.decided"
    ]
    assert said == [f"{me} : deny by operator {me} ; USER={me} ; COMMAND=echo walked ; REQUEST={bg.request_id}"], said


def test_cancel_given_a_pending_requests_id_names_the_operation_id_it_takes(walk: Stack) -> None:
    """`airlock cancel REQUEST-ID` answered "operation ... is not running" while the request was pending."""
    bg = ask(walk, ["echo", "cancel-me"], privileged=False, operation_id=f"op-{uuid.uuid4()}")
    wrong = run_cli(walk, "cancel", "--socket", str(walk.operator), bg.request_id)
    assert wrong.returncode == 1 and "is a pending request's ID; cancel takes its operation ID" in wrong.stderr, wrong
    assert wait_pending(walk, bg.request_id, timeout=2)["request_id"] == bg.request_id  # nothing was decided
    op = wait_pending(walk, bg.request_id)["operation_id"]
    right = run_cli(walk, "cancel", "--socket", str(walk.operator), op)
    assert right.returncode == 0, right
    assert bg.result()["error"]["code"] == "denied"


def test_a_refused_token_is_named_as_the_likely_cause(walk: Stack) -> None:
    """A revoked token read `unauthorized: unauthorized`; the CLI knows it sent one and says so."""
    argv = [sys.executable, "-m", "airlock", "run", "--socket", str(walk.agent), "--no-privilege", "--", "true"]
    env = os.environ | {"AIRLOCK_TOKEN": "alt_not-a-token-anyone-issued"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 125 and "unauthorized" in done.stderr, done
    assert "the session token (--token-file or $AIRLOCK_TOKEN) was refused" in done.stderr, done
    plain = run_cli(walk, "run", "--socket", str(walk.agent), "--no-privilege", "--", "true")
    assert plain.returncode == 0 and "session token" not in plain.stderr, plain  # the control: no token, no hint
