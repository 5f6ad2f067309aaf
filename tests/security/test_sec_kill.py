"""Killing a running job is an operator's, and another agent's job is never an agent's (issue 35).

Attack: mallory (an agent) tries to stop alice's running ``sleep`` by every
door an agent has: the operator verb ``kill`` on agent.sock (intake refuses
operator verbs as it refuses a bad token), ``cancel`` with alice's operation
ID (an agent's cancel reaches only its own operations), and operator.sock
itself (not hers to reach).  Alice's job keeps running.  Control: alice's own
``cancel`` of her job and root's ``airlock kill`` both stop a job, so the
job was stoppable and the refusals are the rule.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from secsupport import agent_exec, agent_request, final, needs_root, red_stack, replies, throwaway_user

from support import Stack
from waits import processes_with, wait_process

pytestmark = needs_root


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("alkla") as alice, throwaway_user("alklm") as mallory:
        yield alice, mallory


@pytest.fixture(scope="module")
def kstack(users: tuple[Any, Any]) -> Iterator[Stack]:
    alice, mallory = users
    config = f"""
agents:
  users: [{alice.pw_name}, {mallory.pw_name}, root]
policy:
  default: deny
  rules:
    - name: sleep
      decision: allow
      users: [{alice.pw_name}, {mallory.pw_name}]
      privileged: false
      commands: [[/usr/bin/sleep, "..."]]
"""
    with red_stack(config) as stack:
        yield stack


def _running(marker: str) -> bool:
    return bool(processes_with(["/usr/bin/sleep", marker]))


def _start(stack: Stack, user: Any) -> tuple[Any, str, str, str]:
    marker = f"{300 + uuid.uuid4().int % 300}.{uuid.uuid4().int % 10**6:06d}"
    rid, op = f"kl-{uuid.uuid4()}", f"op-{uuid.uuid4()}"
    proc = agent_request(
        stack.agent, user, "exec", {"argv": ["sleep", marker], "privileged": False, "operation_id": op}, request_id=rid
    )
    wait_process(["/usr/bin/sleep", marker])
    return proc, marker, rid, op


def test_another_agent_cannot_kill_or_cancel_a_running_job(kstack: Stack, users: tuple[Any, Any]) -> None:
    alice, mallory = users
    proc, marker, rid, op = _start(kstack, alice)
    # The operator verb on the agent door: refused like a bad token.
    refused = final(replies(agent_request(kstack.agent, mallory, "kill", {"ref": rid, "signal": "KILL"})))
    assert refused["ok"] is False and refused["error"]["code"] == "unauthorized", refused
    # The agent's own cancel, with alice's operation ID: not hers, so not found.
    cancel = final(replies(agent_request(kstack.agent, mallory, "cancel", {"operation_id": op})))
    assert cancel["ok"] is False and cancel["error"]["code"] == "not_found", cancel
    # operator.sock: the kernel keeps her out (0660, not her group) before airlock reads a byte.
    with pytest.raises(PermissionError):
        _connect_as(kstack.operator, mallory)
    assert _running(marker), "alice's job was stopped by another agent"
    # Control: root's kill stops it, and nothing of it is left.
    done = kstack.cli("kill", rid, "--reason", "control")
    assert done.returncode == 0, done.stderr
    out = final(replies(proc))
    assert out["ok"] is True and out["data"]["stages"][0]["signal"] == 15, out
    assert not _running(marker)


def test_an_agent_stops_its_own_job_with_cancel(kstack: Stack, users: tuple[Any, Any]) -> None:
    alice, _ = users
    proc, marker, _rid, op = _start(kstack, alice)
    cancel = final(replies(agent_request(kstack.agent, alice, "cancel", {"operation_id": op})))
    assert cancel["ok"] is True and cancel["data"]["cancelling"] is True, cancel
    replies(proc)
    assert not _running(marker)
    assert agent_exec(kstack.agent, alice, {"argv": ["sleep", "0"], "privileged": False})["ok"] is True


def _connect_as(path: str, user: Any) -> None:
    """Connect to ``path`` from a child running as ``user``; PermissionError if the kernel refuses."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        code = 0
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
        except PermissionError:
            code = 13
        except OSError:
            code = 1
        os.write(w, bytes([code]))
        os._exit(0)
    os.close(w)
    code = os.read(r, 1)[0]
    os.close(r)
    os.waitpid(pid, 0)
    if code == 13:
        raise PermissionError(path)
    assert code == 0, "unexpected connect error"
