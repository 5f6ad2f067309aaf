"""A grant's uses cannot be exceeded, and only one agent's own identical requests are decided together (issue 34).

An operator approved alice's command with ``--grant 30m --uses 2``.  Alice, hostile
and fast, fires many copies of it at once, hoping that requests racing through
approval all find the grant before any of its uses is counted: exactly two run
without a person; every other one waits for an operator (and is denied here).

Bob sends the very same command while alice's copy is pending: his request is
never attached to hers (an operator's approval of alice's request must not
run bob's), and stays a question of its own after hers is decided.

Controls: the granted command runs at once (the grant works), and alice's own
second copy *is* attached to her first and decided with it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_request, final, needs_root, red_stack, replies, throwaway_user

from support import Stack
from waits import until, wait_pending

pytestmark = needs_root

RACERS = 10


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("algua") as alice, throwaway_user("algub") as bob:
        yield alice, bob


@pytest.fixture(scope="module")
def ustack(users: tuple[Any, Any]) -> Iterator[Stack]:
    alice, bob = users
    config = f"""
agents:
  users: [{alice.pw_name}, {bob.pw_name}]
approval:
  timeout_seconds: 60
  max_pending_per_agent: 64
  asks_per_minute: 600
policy:
  default: ask
  rules:
    - name: touchy
      decision: ask
      commands: [[/usr/bin/touch, "..."]]
"""
    with red_stack(config) as stack:
        yield stack


def shared() -> Path:
    folder = Path("/tmp") / f"algu-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o1777)
    return folder


def send(stack: Stack, user: Any, argv: list[str]) -> tuple[Any, str]:
    request_id = f"gu-{uuid.uuid4()}"
    args: dict[str, Any] = {"argv": argv, "privileged": False, "operation_id": f"op-{uuid.uuid4()}"}
    return agent_request(stack.agent, user, "exec", args, request_id=request_id), request_id


def pending_of(stack: Stack, uid: int) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = stack.native("pending", path=stack.operator)["data"]["pending"]
    return [p for p in listed if p["peer"]["uid"] == uid]


def test_racing_requests_cannot_use_a_grant_more_often_than_its_uses(ustack: Stack, users: tuple[Any, Any]) -> None:
    alice, _bob = users
    target = shared() / "raced"
    argv = ["touch", str(target)]
    proc, request_id = send(ustack, alice, argv)
    wait_pending(ustack, request_id)
    done = ustack.cli("approve", request_id, "--grant", "30m", "--uses", "2")
    assert done.returncode == 0, done.stderr
    assert final(replies(proc))["ok"] is True  # the approved one itself
    grant_id = next(
        g["grant_id"]
        for g in ustack.native("grants", path=ustack.operator)["data"]["grants"]
        if g["request_id"] == request_id
    )
    racers = [send(ustack, alice, argv)[0] for _ in range(RACERS)]
    # Every copy the grant did not let through waits for a person: deny them all.
    outcomes: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(outcomes) < RACERS and time.monotonic() < deadline:
        for p in pending_of(ustack, alice.pw_uid):
            ustack.native("deny", {"id": p["request_id"]}, path=ustack.operator)
        for racer in [r for r in racers if r.poll() is not None]:
            racers.remove(racer)
            outcomes.append(final(replies(racer)))
        time.sleep(0.05)
    assert len(outcomes) == RACERS, outcomes
    ran = [o for o in outcomes if o["ok"] is True]
    assert len(ran) == 2, [o.get("error", {}).get("code") or o["data"]["decision"] for o in outcomes]
    assert all(o["data"]["decision"]["decided_by"] == f"grant {grant_id}" for o in ran)
    assert all(o["error"]["code"] == "denied" for o in outcomes if o["ok"] is False)
    uses = [
        json.loads(r["payload"]).get("grant_use")
        for r in ustack.journal_rows()
        if r["kind"] == "approval.decided" and json.loads(r["payload"]).get("grant_id") == grant_id
    ]
    assert sorted(uses) == [1, 2]


def test_another_agents_identical_request_is_never_attached(ustack: Stack, users: tuple[Any, Any]) -> None:
    alice, bob = users
    target = shared() / "twin"
    argv = ["touch", str(target)]
    first, first_id = send(ustack, alice, argv)
    wait_pending(ustack, first_id)
    own, own_id = send(ustack, alice, argv)  # control: alice's own copy is attached to her first
    other, other_id = send(ustack, bob, argv)
    bobs = wait_pending(ustack, other_id)  # a question of its own
    assert "attached_to" not in bobs
    until(f"{own_id} attached", lambda: own_id in wait_pending(ustack, first_id).get("attached", []), timeout=20)
    assert wait_pending(ustack, first_id)["attached"] == [own_id]
    assert ustack.native("approve", {"id": first_id}, path=ustack.operator)["ok"] is True
    assert final(replies(first))["ok"] is True and final(replies(own))["ok"] is True
    assert other.poll() is None  # bob's still waits: alice's approval decided nothing of his
    assert wait_pending(ustack, other_id)["request_id"] == other_id
    assert ustack.native("deny", {"id": other_id}, path=ustack.operator)["ok"] is True
    assert final(replies(other))["error"]["code"] == "denied"
