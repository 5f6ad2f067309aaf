"""`airlock policy suggest` never learns what must be seen each time (issue 34).

A hostile agent gets an operator to approve, as root, again and again:

- ``cat`` of a file in its own home (a path argument it can change: each run
  is flagged and bound, and must be decided again): no rule is suggested for
  it, or the next run would read whatever the agent swapped in;
- ``cat`` of two different root-owned files in one directory: the suggestion
  takes only a file name in that directory (``DIR/{arg1:file}``, issue 45) and
  never folds them into ``cat {arg1}``, which as root would read ``/etc/shadow``.

Control: the suggested file is installed in the live stack's policy.d and
approval reloads it: the very requests operators approved now run at once
by the suggested rules, while ``cat /etc/shadow`` and the agent's own file
still ask.

Issue 45 (5a, 5b), installed and reloaded the same way:

- five approved root ``cat aN.log`` run in one directory become
  ``[cat, "{arg1:file}"]`` pinned to that ``cwd``: ``cat a5.log`` there runs
  (control), but ``cat /…/secret/token``, ``cat ../secret/token`` and
  ``cat token`` from the secret directory still ask;
- five approved ``tee FILE`` with the same stdin become a rule pinned to that
  stdin's sha256: the same input runs (control), any other asks.
"""

from __future__ import annotations

import base64
import hashlib
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


def approve_each(stack: Stack, agent: pwd.struct_passwd, argv: list[str], times: int, **extra: Any) -> None:
    for _ in range(times):
        request_id = f"sg-{uuid.uuid4()}"
        args: dict[str, Any] = {"argv": argv, "privileged": True, "operation_id": f"op-{uuid.uuid4()}"} | extra
        proc = agent_request(stack.agent, agent, "exec", args, request_id=request_id)
        wait_pending(stack, request_id, timeout=30)
        assert stack.cli("approve", "-y", request_id).returncode == 0
        assert final(replies(proc))["ok"] is True


def asks(stack: Stack, agent: pwd.struct_passwd, argv: list[str], **extra: Any) -> bool:
    request_id = f"sg-{uuid.uuid4()}"
    args: dict[str, Any] = {"argv": argv, "privileged": True, "operation_id": f"op-{uuid.uuid4()}"} | extra
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


def install(stack: Stack, suggested: Path) -> None:
    """The suggested file in the stack's policy.d (in place of the last one: each suggestion has every
    rule again), and approval reloaded (SIGHUP) with it."""
    policy_d = stack.runtime_dir / "policy.d"
    policy_d.mkdir(exist_ok=True)
    shutil.copy(suggested, policy_d / "60-suggested.yaml")
    reloads = sum(1 for r in stack.journal_rows() if r["kind"] == "policy.reloaded")
    os.kill(stack.service_pid("approval"), signal.SIGHUP)
    deadline = time.monotonic() + 15
    while sum(1 for r in stack.journal_rows() if r["kind"] == "policy.reloaded") == reloads:
        assert time.monotonic() < deadline, "approval did not reload"
        time.sleep(0.05)


def by_policy(stack: Stack, agent: pwd.struct_passwd, argv: list[str], **extra: Any) -> dict[str, Any]:
    reply = agent_exec(stack.agent, agent, {"argv": argv, "privileged": True} | extra)
    assert reply["ok"] is True and reply["data"]["decision"]["decided_by"] == "policy", reply
    return reply


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
    # Issue 45: the two paths share a directory: a file name there, never any path.
    assert patterns == [("/usr/bin/cat", f"{rootdir}/{{arg1:file}}")], out.read_text()
    assert all(r["users"] == [agent.pw_name] and r["privileged"] is True for r in rules)

    # Control: installed and reloaded, the suggestion allows exactly what operators approved.
    install(sstack, out)
    for path in (first, second):
        reply = agent_exec(sstack.agent, agent, {"argv": ["cat", str(path)], "privileged": True})
        assert reply["ok"] is True and reply["data"]["decision"]["decided_by"] == "policy", reply
    assert asks(sstack, agent, ["cat", "/etc/shadow"])  # no placeholder took the paths
    assert asks(sstack, agent, ["cat", str(own)])  # the agent's own file is decided each time


def test_5a_file_names_approved_in_one_directory_stay_there(
    sstack: Stack, agent: pwd.struct_passwd, rootdir: Path, tmp_path: Path
) -> None:
    logs, secret = rootdir / "app" / "logs", rootdir / "app" / "secret"
    logs.mkdir(parents=True)
    secret.mkdir()
    for n in range(6):
        (logs / f"a{n}.log").write_text(f"log {n}\n")
    (secret / "token").write_text("s3cret-token\n")
    for n in range(5):
        approve_each(sstack, agent, ["cat", f"a{n}.log"], 1, cwd=str(logs))
    out = tmp_path / "61-suggested.yaml"
    done = sstack.cli("policy", "suggest", "--since", "1h", "--min", "5", "--output", str(out))
    assert done.returncode == 0, done.stderr
    rules = [r for r in yaml.safe_load(out.read_text())["rules"] if "{arg1:file}" in r["commands"][0]]
    assert [(r["commands"][0], r["cwd"]) for r in rules] == [(["/usr/bin/cat", "{arg1:file}"], str(logs))]
    assert f"# cwd: {logs}; stdin: none" in out.read_text()
    install(sstack, out)
    # Control: a file name in the approved directory runs by the rule.
    assert base64.b64decode(by_policy(sstack, agent, ["cat", "a5.log"], cwd=str(logs))["data"]["stdout"]) == b"log 5\n"
    # What the old suggestion ([cat, "{arg1}"], no cwd) let in as root: every one asks now.
    assert asks(sstack, agent, ["cat", str(secret / "token")], cwd=str(logs))
    assert asks(sstack, agent, ["cat", "../secret/token"], cwd=str(logs))
    assert asks(sstack, agent, ["cat", "token"], cwd=str(secret))


def test_5b_stdin_approved_is_the_only_stdin_learned(
    sstack: Stack, agent: pwd.struct_passwd, rootdir: Path, tmp_path: Path
) -> None:
    motd = rootdir / "motd"
    motd.write_text("")
    harmless = base64.b64encode(b"Welcome to app1\n").decode()
    approve_each(sstack, agent, ["tee", str(motd)], 5, stdin=harmless)
    out = tmp_path / "62-suggested.yaml"
    done = sstack.cli("policy", "suggest", "--since", "1h", "--min", "5", "--output", str(out))
    assert done.returncode == 0, done.stderr
    rules = [r for r in yaml.safe_load(out.read_text())["rules"] if r["commands"][0][0] == "/usr/bin/tee"]
    digest = hashlib.sha256(b"Welcome to app1\n").hexdigest()
    assert [(r["commands"][0], r["stdin"]) for r in rules] == [(["/usr/bin/tee", str(motd)], f"sha256:{digest}")]
    install(sstack, out)
    by_policy(sstack, agent, ["tee", str(motd)], stdin=harmless)  # control: the approved input
    hostile = base64.b64encode(b"root::0:0::/root:/bin/sh\n").decode()
    assert asks(sstack, agent, ["tee", str(motd)], stdin=hostile)
    assert asks(sstack, agent, ["tee", str(motd)])  # no stdin is another input too
    assert motd.read_text() == "Welcome to app1\n"
