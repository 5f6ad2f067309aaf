"""A time-boxed grant covers its requester and its scope, nothing more (issue 18).

An operator approved one agent's command with ``--grant``.  Another agent
sending the very same command, the same agent with another command or another
session, and -- for a rule grant -- the same agent with a command another rule
decides: each still waits for an operator (and is denied here: nothing runs).
A rule that needs two approvers takes no grant at all, and one operator's
approval does not run it; the operator who asked never counts towards it,
and the same operator approving twice is one approval.

The control: the granted agent's same command (or, for a rule grant, another
command of that rule) runs at once, without an operator -- so the refusals are
the grant's limits, not a grant that never works; and two distinct
operators (root, then bob) do run the quorum work.
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

pytestmark = needs_root


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("algra") as alice, throwaway_user("algrb") as bob:
        yield alice, bob


@pytest.fixture(scope="module")
def gstack(users: tuple[Any, Any]) -> Iterator[Stack]:
    alice, bob = users
    config = f"""
agents:
  users: [{alice.pw_name}, {bob.pw_name}]
operators:
  users: [{bob.pw_name}]
approval:
  timeout_seconds: 30
policy:
  default: ask
  rules:
    - name: touchy
      decision: ask
      commands: [[/usr/bin/touch, "..."]]
    - name: pair
      decision: ask
      approvals: 2
      commands: [[/usr/bin/mkdir, "..."]]
"""
    with red_stack(config) as stack:
        os.chmod(stack.operator, 0o666)  # bob reaches the operator door; it still admits only operators.users
        yield stack


def shared(tmp_path: Path) -> Path:
    folder = Path("/tmp") / f"algr-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o1777)
    return folder


def send(stack: Stack, user: Any, argv: list[str], session: str | None = None) -> tuple[Any, str]:
    request_id = f"gr-{uuid.uuid4()}"
    args: dict[str, Any] = {"argv": argv, "privileged": False, "operation_id": f"op-{uuid.uuid4()}"}
    if session:
        args["session"] = session
    return agent_request(stack.agent, user, "exec", args, request_id=request_id), request_id


def pending(stack: Stack, request_id: str, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = stack.native("pending", path=stack.operator)["data"]["pending"]
        if any(p["request_id"] == request_id for p in listed):
            return True
        time.sleep(0.05)
    return False


def asks_and_is_denied(stack: Stack, user: Any, argv: list[str], session: str | None = None) -> None:
    proc, request_id = send(stack, user, argv, session)
    assert pending(stack, request_id), "it did not wait for an operator"
    assert stack.native("deny", {"id": request_id}, path=stack.operator)["ok"] is True
    assert final(replies(proc))["error"]["code"] == "denied"


def runs_at_once(stack: Stack, user: Any, argv: list[str], session: str | None = None) -> dict[str, Any]:
    proc, _ = send(stack, user, argv, session)
    reply = final(replies(proc, timeout=30))
    assert reply["ok"] is True, reply
    return reply


def granted(stack: Stack, user: Any, argv: list[str], *flags: str, session: str | None = None) -> str:
    proc, request_id = send(stack, user, argv, session)
    assert pending(stack, request_id)
    done = stack.cli("approve", request_id, *flags)
    assert done.returncode == 0, done.stderr
    assert final(replies(proc))["ok"] is True
    return str(
        next(
            g["grant_id"]
            for g in stack.native("grants", path=stack.operator)["data"]["grants"]
            if g["request_id"] == request_id
        )
    )


def asks_and_is_withdrawn(stack: Stack, user: Any, argv: list[str], session: str | None = None) -> None:
    """It waits for an operator; the agent goes away (no person's deny, which no grant would then cover)."""
    proc, request_id = send(stack, user, argv, session)
    assert pending(stack, request_id), "it did not wait for an operator"
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 20
    while pending(stack, request_id, timeout=0.1):
        assert time.monotonic() < deadline, "it was not withdrawn"


def test_a_command_grant_covers_its_requester_command_and_session_only(
    gstack: Stack, users: tuple[Any, Any], tmp_path: Path
) -> None:
    alice, bob = users
    folder = shared(tmp_path)
    target = folder / "granted"
    grant_id = granted(gstack, alice, ["touch", str(target)], "--grant", "10m", session="s1")
    target.unlink()
    asks_and_is_denied(gstack, bob, ["touch", str(target)], session="s1")  # another agent, the same command
    asks_and_is_denied(gstack, alice, ["touch", str(folder / "other")], session="s1")  # another command
    # The same command in another session, or none: people are asked (a person's deny would be remembered
    # for the command, issue 45, and keep the grant from it too: the agent withdraws instead).
    asks_and_is_withdrawn(gstack, alice, ["touch", str(target)], session="s2")  # another session
    asks_and_is_withdrawn(gstack, alice, ["touch", str(target)])  # no session
    assert not target.exists() and not (folder / "other").exists()
    # Control: the granted agent, its command, its session: no operator needed.
    reply = runs_at_once(gstack, alice, ["touch", str(target)], session="s1")
    assert reply["data"]["decision"]["decided_by"] == f"grant {grant_id}" and target.owner() == alice.pw_name
    used = [
        json.loads(r["payload"])
        for r in gstack.journal_rows()
        if r["kind"] == "approval.decided" and json.loads(r["payload"]).get("grant_id") == grant_id
    ]
    assert len(used) == 1 and used[0]["by"] == "grant"
    assert gstack.cli("grants", "revoke", grant_id).returncode == 0


def test_a_rule_grant_does_not_reach_another_rules_commands(
    gstack: Stack, users: tuple[Any, Any], tmp_path: Path
) -> None:
    alice, _ = users
    folder = shared(tmp_path)
    grant_id = granted(gstack, alice, ["touch", str(folder / "a")], "--grant", "10m", "--scope", "rule")
    asks_and_is_denied(gstack, alice, ["rm", "-f", str(folder / "a")])  # the default's ask: not the rule's
    assert (folder / "a").exists()
    runs_at_once(gstack, alice, ["touch", str(folder / "b")])  # control: the rule's other commands run
    assert (folder / "b").exists()
    assert gstack.cli("grants", "revoke", grant_id).returncode == 0


def test_a_quorum_rule_takes_no_grant_and_one_approval_does_not_run_it(
    gstack: Stack, users: tuple[Any, Any], tmp_path: Path
) -> None:
    alice, _ = users
    folder = shared(tmp_path)
    proc, request_id = send(gstack, alice, ["mkdir", str(folder / "two")])
    assert pending(gstack, request_id)
    refused = gstack.cli("approve", request_id, "--grant", "10m")
    assert refused.returncode == 1 and "several approvers" in refused.stderr
    once = gstack.cli("approve", request_id)
    assert once.returncode == 0 and "1 of 2" in once.stdout, once.stdout
    assert pending(gstack, request_id, timeout=1) and not (folder / "two").exists()
    again = gstack.cli("approve", request_id)  # the same operator (root) a second time
    assert again.returncode == 1 and "already approved" in again.stderr
    assert not (folder / "two").exists()
    assert gstack.native("deny", {"id": request_id}, path=gstack.operator)["ok"] is True
    assert final(replies(proc))["error"]["code"] == "denied" and not (folder / "two").exists()


def operator_call(stack: Stack, user: Any, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    return final(replies(agent_request(stack.operator, user, verb, args)))


def test_a_quorum_needs_two_distinct_operators_and_the_requester_never_counts(
    gstack: Stack, users: tuple[Any, Any], tmp_path: Path
) -> None:
    alice, bob = users
    folder = shared(tmp_path)
    # bob, an operator, asks for quorum work: his own approval never counts, even with allow_self_approval.
    proc, request_id = send(gstack, bob, ["mkdir", str(folder / "bobs")])
    assert pending(gstack, request_id)
    own = operator_call(gstack, bob, "approve", {"id": request_id})
    assert own["error"]["code"] == "conflict" and "requester" in own["error"]["message"]
    assert gstack.cli("approve", request_id).stdout.count("1 of 2") == 1  # root: one of two
    assert pending(gstack, request_id, timeout=1) and not (folder / "bobs").exists()
    assert gstack.native("deny", {"id": request_id}, path=gstack.operator)["ok"] is True
    assert final(replies(proc))["error"]["code"] == "denied" and not (folder / "bobs").exists()
    # Control: alice's request, approved by root and then by bob, two distinct operators, runs.
    proc, request_id = send(gstack, alice, ["mkdir", str(folder / "alices")])
    assert pending(gstack, request_id)
    assert gstack.cli("approve", request_id).returncode == 0
    assert not (folder / "alices").exists()
    second = operator_call(gstack, bob, "approve", {"id": request_id})
    assert second["ok"] is True and second["data"]["progress"] == "2 of 2", second
    assert final(replies(proc))["ok"] is True and (folder / "alices").is_dir()
