"""`stop` is not an agent's to give (issue 39, item 3).

The sudo-proxy dialect's ``{"action": "stop"}`` made intake exit for every
agent: another agent's pending request was cut without an answer and
withdrawn, and a running job lost its reply.  In sudo-proxy the daemon belongs
to one user; airlock's intake serves many, so ``stop`` is now an operator's
(root or ``operators``), and an agent's is refused with a reason.

Attack: mallory (an agent) sends ``stop`` while alice's request waits for an
operator.  Intake keeps running (same pid), alice's request is still pending,
and once approved it runs and alice gets her reply.  Control: the operator's
own ``stop`` (root here) does make intake exit, and ``ping`` still works for
mallory -- the refusal is the rule, not a broken control action.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_request, as_user, final, needs_root, red_stack, replies, throwaway_user

from support import Stack, now_iso, wait_pending
from waits import until

pytestmark = needs_root

_LEGACY_CLIENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(job["socket"])
s.sendall(json.dumps(job["request"]).encode() + b"\n")
buf = b""
while not buf.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
print(buf.decode().strip())
"""


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("alspa") as alice, throwaway_user("alspm") as mallory:
        yield alice, mallory


@pytest.fixture(scope="module")
def sstack(users: tuple[Any, Any]) -> Iterator[Stack]:
    alice, mallory = users
    config = f"""
agents:
  users: [{alice.pw_name}, {mallory.pw_name}, root]
approval:
  timeout_seconds: 60
policy:
  default: ask
"""
    with red_stack(config) as stack:
        yield stack


def legacy(stack: Stack, user: Any, **fields: Any) -> dict[str, Any]:
    request = {"id": f"lg-{uuid.uuid4()}", "time": now_iso(), "pipeline": []} | fields
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _LEGACY_CLIENT],
        input=json.dumps({"socket": str(stack.agent), "request": request}),
        capture_output=True,
        text=True,
        timeout=40,
        check=True,
        **as_user(user),
    )
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def test_an_agent_cannot_stop_intake_for_everyone(sstack: Stack, users: tuple[Any, Any]) -> None:
    alice, mallory = users
    pid = sstack.service_pid("intake")
    request_id = f"victim-{uuid.uuid4()}"
    victim = agent_request(
        sstack.agent,
        alice,
        "exec",
        {"argv": ["echo", "alice-ran"], "privileged": False, "operation_id": f"op-{uuid.uuid4()}"},
        request_id=request_id,
    )
    wait_pending(sstack, request_id)

    refused = legacy(sstack, mallory, action="stop")
    assert refused["status"] == "error" and refused["code"] == "unauthorized", refused
    assert "operator" in refused["message"]
    assert legacy(sstack, mallory, action="ping")["message"] == "pong"  # control: the door is open to her
    time.sleep(0.3)  # a stop would have been scheduled at once (call_soon): give it the chance to show
    assert sstack.service_pid("intake") == pid
    assert wait_pending(sstack, request_id)["request_id"] == request_id

    approved = sstack.native("approve", {"id": request_id}, path=sstack.operator)
    assert approved["ok"] is True, approved
    reply = final(replies(victim))
    assert reply["ok"] is True, reply
    assert base64.b64decode(reply["data"]["stdout"]) == b"alice-ran\n"
    assert "intake.stop.refused" in (Path(sstack.runtime_dir) / "logs" / "intake.log").read_text()


def test_control_the_operators_stop_still_stops_intake(sstack: Stack) -> None:
    pid = sstack.service_pid("intake")
    request = {"id": f"lg-{uuid.uuid4()}", "time": now_iso(), "pipeline": [], "action": "stop"}
    reply = sstack.send_raw(json.dumps(request).encode() + b"\n")[0]
    assert reply["status"] == "ok" and reply["message"] == "stopping", reply
    until(f"intake (pid {pid}) gone", lambda: not Path(f"/proc/{pid}").exists(), timeout=30)
