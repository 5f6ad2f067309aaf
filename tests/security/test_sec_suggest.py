"""`airlock policy suggest` never learns what must be seen each time (issue 34).

A hostile agent gets an operator to approve, as root, again and again:

- ``cat`` of a file in its own home (a path argument it can change: each run
  is flagged and bound, and must be decided again): no rule is suggested for
  it, or the next run would read whatever the agent swapped in;
- ``cat`` of two different root-owned files: the suggestion keeps each file
  literal and never folds them into ``cat {arg1}``, which as root would read
  ``/etc/shadow``.

Control: the suggested file is installed in the live stack's policy.d and
approval reloads it: the very requests operators approved now run at once
by the suggested rules, while ``cat /etc/shadow`` and the agent's own file
still ask.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from secsupport import agent_exec, agent_request, final, needs_root, red_stack, replies, root_dir, throwaway_user

from support import Stack, wait_pending

pytestmark = needs_root


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alsug") as user:
        yield user


@pytest.fixture(scope="module")
def rootdir() -> Iterator[Path]:
    path = root_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def sstack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    config = f"""
agents:
  users: [{agent.pw_name}]
approval:
  timeout_seconds: 30
  asks_per_minute: 600
policy:
  default: ask
"""
    with red_stack(config) as stack:
        yield stack


def approve_each(stack: Stack, agent: pwd.struct_passwd, argv: list[str], times: int) -> None:
    for _ in range(times):
        request_id = f"sg-{uuid.uuid4()}"
        args: dict[str, Any] = {"argv": argv, "privileged": True, "operation_id": f"op-{uuid.uuid4()}"}
        proc = agent_request(stack.agent, agent, "exec", args, request_id=request_id)
        wait_pending(stack, request_id, timeout=30)
        assert stack.cli("approve", "-y", request_id).returncode == 0
        assert final(replies(proc))["ok"] is True


def asks(stack: Stack, agent: pwd.struct_passwd, argv: list[str]) -> bool:
    request_id = f"sg-{uuid.uuid4()}"
    args: dict[str, Any] = {"argv": argv, "privileged": True, "operation_id": f"op-{uuid.uuid4()}"}
    proc = agent_request(stack.agent, agent, "exec", args, request_id=request_id)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        listed = stack.native("pending", path=stack.operator)["data"]["pending"]
        if any(p["request_id"] == request_id for p in listed):
            assert stack.native("deny", {"id": request_id}, path=stack.operator)["ok"] is True
            assert final(replies(proc))["error"]["code"] == "denied"
            return True
        time.sleep(0.05)
    raise AssertionError("neither ran nor waited")


def test_suggest_learns_neither_changeable_arguments_nor_any_path(
    sstack: Stack, agent: pwd.struct_passwd, rootdir: Path, tmp_path: Path
) -> None:
    own = Path(agent.pw_dir) / "notes.txt"
    own.write_text("mine\n")
    os.chown(own, agent.pw_uid, agent.pw_gid)
    first, second = rootdir / "a.txt", rootdir / "b.txt"
    first.write_text("a\n")
    second.write_text("b\n")
    approve_each(sstack, agent, ["cat", str(own)], 3)
    approve_each(sstack, agent, ["cat", str(first)], 3)
    approve_each(sstack, agent, ["cat", str(second)], 3)
    out = tmp_path / "60-suggested.yaml"
    done = sstack.cli("policy", "suggest", "--since", "1h", "--min", "3", "--output", str(out))
    assert done.returncode == 0, done.stderr
    rules = yaml.safe_load(out.read_text())["rules"]
    patterns = sorted(tuple(r["commands"][0]) for r in rules)
    assert patterns == [("/usr/bin/cat", str(first)), ("/usr/bin/cat", str(second))], out.read_text()
    assert all(r["users"] == [agent.pw_name] and r["privileged"] is True for r in rules)

    # Control: installed and reloaded, the suggestion allows exactly what operators approved.
    policy_d = sstack.runtime_dir / "policy.d"
    policy_d.mkdir(exist_ok=True)
    shutil.copy(out, policy_d / out.name)
    reloads = sum(1 for r in sstack.journal_rows() if r["kind"] == "policy.reloaded")
    os.kill(sstack.service_pid("approval"), signal.SIGHUP)
    deadline = time.monotonic() + 15
    while sum(1 for r in sstack.journal_rows() if r["kind"] == "policy.reloaded") == reloads:
        assert time.monotonic() < deadline, "approval did not reload"
        time.sleep(0.05)
    for path in (first, second):
        reply = agent_exec(sstack.agent, agent, {"argv": ["cat", str(path)], "privileged": True})
        assert reply["ok"] is True and reply["data"]["decision"]["decided_by"] == "policy", reply
    assert asks(sstack, agent, ["cat", "/etc/shadow"])  # no placeholder took the paths
    assert asks(sstack, agent, ["cat", str(own)])  # the agent's own file is decided each time
