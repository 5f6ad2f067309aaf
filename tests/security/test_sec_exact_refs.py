"""Attack 3 of issue 27: the approve line an operator pastes approves a different request.

The agent asks for something harmless as ``deploy-N``; the relay sends the
operator ``ssh host airlock approve deploy-N``; the agent withdraws it and
asks for a root shell as ``deploy-Nx`` (or another agent asks under the very
same ID ``deploy-N``); the operator pastes the line.  ``approve`` used to fall
back to a unique prefix, so the line approved the root shell.  Now approve
acts only on the whole ID of a request pending now, and every line airlock
sends carries ``--expect DIGEST``: the request pending under that ID must be
the one the line was made for, or the approval is refused
(``request_changed``), journaled, and nothing is decided.
"""

from __future__ import annotations

import json
import pwd
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_request, final, needs_root, red_stack, replies, throwaway_user

from airlock.relay import message

from support import Stack, wait_pending

pytestmark = needs_root


@pytest.fixture(scope="module")
def agents() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    with throwaway_user("alref") as first, throwaway_user("alref") as second:
        yield first, second


@pytest.fixture(scope="module")
def rstack(agents: tuple[pwd.struct_passwd, pwd.struct_passwd]) -> Iterator[Stack]:
    first, second = agents
    config = f"""
agents:
  users: [root, {first.pw_name}, {second.pw_name}]
approval:
  timeout_seconds: 60
policy:
  default: ask
"""
    with red_stack(config) as stack:
        yield stack


def _relay_line(stack: Stack, request_id: str) -> list[str]:
    """The approve line the relay sends for this request (from its approval.pending event), minus ``ssh HOST``."""
    events = stack.native("events", {"scope": {"request_id": request_id}}, path=stack.operator)["data"]["events"]
    pending = next(e for e in events if e["kind"] == "approval.pending")
    line = message.pending_message(pending, "host", str, time.time())["decide"]
    argv = shlex.split(line)
    assert argv[:3] == ["ssh", "host", "airlock"], line
    return argv[3:]


def _ask(stack: Stack, user: pwd.struct_passwd, request_id: str, argv: list[str]) -> subprocess.Popen[str]:
    args = {"argv": argv, "privileged": True, "operation_id": f"op-{secrets.token_hex(8)}"}
    proc = agent_request(stack.agent, user, "exec", args, request_id=request_id)
    wait_pending(stack, request_id)
    return proc


def _withdraw(stack: Stack, proc: subprocess.Popen[str], request_id: str) -> None:
    proc.kill()  # the agent goes away: its pending request is withdrawn
    proc.wait(10)
    deadline = time.monotonic() + 15
    while any(p["request_id"] == request_id for p in stack.native("pending", path=stack.operator)["data"]["pending"]):
        assert time.monotonic() < deadline, "the request was never withdrawn"
        time.sleep(0.05)


def _pending_ids(stack: Stack) -> list[str]:
    return [p["request_id"] for p in stack.native("pending", path=stack.operator)["data"]["pending"]]


def _deny(stack: Stack, proc: subprocess.Popen[str], request_id: str) -> dict[str, Any]:
    assert stack.cli("deny", request_id, "--reason", "test over").returncode == 0
    return final(replies(proc))


def test_a_pasted_line_never_approves_the_request_asked_after_it(
    rstack: Stack, agents: tuple[pwd.struct_passwd, pwd.struct_passwd], marks: Path
) -> None:
    agent, _ = agents
    mark = marks / "prefix-pwned"
    first = f"deploy-{secrets.token_hex(3)}"
    proc = _ask(rstack, agent, first, ["/usr/bin/id", "-u"])
    line = _relay_line(rstack, first)
    _withdraw(rstack, proc, first)
    second = first + "x"
    proc = _ask(rstack, agent, second, ["/bin/sh", "-c", f"touch {mark}"])

    pasted = rstack.cli(*line, "--reason", "the id -u I was shown")
    assert pasted.returncode == 1 and "not_found" in pasted.stderr, (line, pasted.stdout, pasted.stderr)
    # The line as it was sent before (no --expect) does not reach deploy-Nx either.
    bare = rstack.cli("approve", first, "--reason", "the id -u I was shown")
    assert bare.returncode == 1 and "not_found" in bare.stderr, bare.stdout
    assert second in _pending_ids(rstack)  # nothing was decided
    # `show` names the request that ID named, not the one pending now.
    shown = rstack.native("show", {"ref": first}, path=rstack.operator)["data"]
    assert shown["request_id"] == first and shown["state"] != "pending" and shown["settled"] is True
    assert _deny(rstack, proc, second)["error"]["code"] == "denied"
    assert not mark.exists()

    # Control: the same pasted line approves the request it was made for while that one waits.
    third = f"deploy-{secrets.token_hex(3)}"
    proc = _ask(rstack, agent, third, ["/usr/bin/id", "-u"])
    done = rstack.cli(*_relay_line(rstack, third), "--reason", "the id -u I was shown")
    assert done.returncode == 0, done.stderr
    reply = final(replies(proc))
    assert reply["ok"] is True and reply["data"]["stages"][0]["exit_code"] == 0, reply


def test_the_same_id_asked_again_by_another_agent_is_refused(
    rstack: Stack, agents: tuple[pwd.struct_passwd, pwd.struct_passwd], marks: Path
) -> None:
    first, second = agents
    mark = marks / "same-id-pwned"
    request_id = f"deploy-{secrets.token_hex(3)}"
    proc = _ask(rstack, first, request_id, ["/usr/bin/id", "-u"])
    line = _relay_line(rstack, request_id)
    _withdraw(rstack, proc, request_id)
    # Request IDs are each agent's own: another agent may ask under the same one now.
    proc = _ask(rstack, second, request_id, ["/bin/sh", "-c", f"touch {mark}"])

    pasted = rstack.cli(*line, "--reason", "the id -u I was shown")
    assert pasted.returncode == 1 and "request_changed" in pasted.stderr, (line, pasted.stdout, pasted.stderr)
    assert request_id in _pending_ids(rstack)  # nothing was decided
    refused = [
        json.loads(r["payload"])
        for r in rstack.journal_rows()
        if r["kind"] == "operator.action" and r["request_id"] == request_id
    ]
    assert any(p.get("action") == "refused" and p.get("code") == "request_changed" for p in refused), refused
    assert not any(p.get("action") == "approve" for p in refused)
    assert _deny(rstack, proc, request_id)["error"]["code"] == "denied"
    assert not mark.exists()
