"""Operation IDs belong to their agent (issue 14).

Agent B claims the operation ID agent A is about to use (an explicit one, or
A's derived one, which anyone can compute).  A's request must still run, and
B must learn nothing from the attempt: no `operation_id_conflict` either way.
A repeating its own request still replays.
"""

from __future__ import annotations

import hashlib
import json
import pwd
import uuid
from collections.abc import Iterator

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    with throwaway_user("alopa") as a, throwaway_user("alopb") as b:
        yield a, b


@pytest.fixture(scope="module")
def ostack(users: tuple[pwd.struct_passwd, pwd.struct_passwd]) -> Iterator[Stack]:
    a, b = users
    config = f"""
agents:
  users: [root, {a.pw_name}, {b.pw_name}]
policy:
  default: deny
  rules:
    - name: echo
      decision: allow
      users: [{a.pw_name}, {b.pw_name}]
      privileged: false
      commands: [[/usr/bin/echo, "..."]]
"""
    with red_stack(config) as stack:
        yield stack


def _echo(word: str, op: str | None = None) -> dict[str, object]:
    args: dict[str, object] = {"argv": ["echo", word], "privileged": False}
    return args | ({"operation_id": op} if op is not None else {})


def _stdout(reply: dict[str, object]) -> str:
    import base64

    data = reply["data"]
    assert isinstance(data, dict)
    return base64.b64decode(data["stdout"]).decode()


def test_another_agent_cannot_squat_or_probe_an_operation_id(
    ostack: Stack, users: tuple[pwd.struct_passwd, pwd.struct_passwd]
) -> None:
    a, b = users
    op = f"deploy-{uuid.uuid4()}"
    # Control: within one agent an ID names one request; another one under it conflicts.
    assert agent_exec(ostack.agent, a, _echo("first", op + "-ctl"))["ok"] is True
    conflict = agent_exec(ostack.agent, a, _echo("other", op + "-ctl"))
    assert conflict["ok"] is False and conflict["error"]["code"] == "operation_id_conflict", conflict

    # B claims the ID first ...
    squat = agent_exec(ostack.agent, b, _echo("squat", op))
    assert squat["ok"] is True
    # ... A's request under it still runs ...
    mine = agent_exec(ostack.agent, a, _echo("mine", op))
    assert mine["ok"] is True and mine["data"]["replay"] is False and _stdout(mine) == "mine\n", mine
    # ... and B probing A's ID with another command learns nothing (runs as its own).
    probe = agent_exec(ostack.agent, b, _echo("probe", op + "-ctl"))
    assert probe["ok"] is True and probe["data"]["replay"] is False
    # A repeating its request replays its own outcome.
    again = agent_exec(ostack.agent, a, _echo("mine", op))
    assert again["ok"] is True and again["data"]["replay"] is True and _stdout(again) == "mine\n"


def test_another_agent_cannot_make_my_unnamed_request_replay(
    ostack: Stack, users: tuple[pwd.struct_passwd, pwd.struct_passwd]
) -> None:
    """Before issue 30 an unnamed request's operation ID was derived from its command, so
    it was computable by anyone; now an unnamed request is always its own operation."""
    a, b = users
    word = f"derived-{uuid.uuid4()}"
    # B claims the ID A's request used to derive (the spec holds A's uid: public).
    spec = {
        "mode": "exec",
        "stages": [["echo", word]],
        "privileged": False,
        "uid": a.pw_uid,
        "env": {},
        "protected_names": [],
        "cwd": None,
        "stdin": None,
        "timeout_ms": None,
        "deadline_ms": None,
        "max_output_bytes": None,
        "forward_agent": False,
    }
    canonical = json.dumps({"spec": spec, "session": ""}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    derived = "op-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert agent_exec(ostack.agent, b, _echo("squat", derived))["ok"] is True
    mine = agent_exec(ostack.agent, a, _echo(word))
    assert mine["ok"] is True and _stdout(mine) == f"{word}\n" and mine["data"]["replay"] is False, mine
    again = agent_exec(ostack.agent, a, _echo(word))
    assert again["data"]["replay"] is False and again["data"]["operation_id"] != mine["data"]["operation_id"]
    # Control: a named operation still replays for its own agent.
    op = f"op-{uuid.uuid4()}"
    assert agent_exec(ostack.agent, a, _echo(word, op))["data"]["replay"] is False
    assert agent_exec(ostack.agent, a, _echo(word, op))["data"]["replay"] is True
