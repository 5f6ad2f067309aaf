"""Attacks on *which binary runs* (issue 14): what policy approved is what runs.

1. The agent's symlink is swapped after `approved`: the runner no longer
   resolves argv[0] again, it runs the file approval bound.
2. The approved binary is replaced while an operator takes their time:
   `binary_changed`, journaled, nothing spawned.
3. A root job's binary that the agent owns could be rewritten in place (same
   inode): `unsafe_binary`, nothing runs.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import (
    agent_exec,
    agent_request,
    final,
    needs_root,
    red_stack,
    replies,
    run_as,
    throwaway_user,
)

from support import Stack, wait_pending

pytestmark = needs_root

TRUE = os.path.realpath("/usr/bin/true")


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("albin") as user:
        yield user


@pytest.fixture(scope="module")
def bstack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    home = agent.pw_dir
    config = f"""
agents:
  users: [root, {agent.pw_name}]
policy:
  default: deny
  rules:
    - name: allow-true
      decision: allow
      users: [{agent.pw_name}]
      commands: [[/usr/bin/true]]
    - name: agent-tool-as-root
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      commands: [[{home}/tool-inplace]]
    - name: agent-tool-asks
      decision: ask
      users: [{agent.pw_name}]
      privileged: false
      commands: [[{home}/tool-ask]]
"""
    with red_stack(config) as stack:
        yield stack


def _payload(path: Path, user: pwd.struct_passwd, mark: Path) -> None:
    """An executable the agent owns that leaves ``mark`` behind when it runs."""
    path.write_text(f"#!/bin/sh\ntouch {mark}\n")
    path.chmod(0o755)
    os.chown(path, user.pw_uid, user.pw_gid)


def _journal(stack: Stack, op: str) -> list[dict[str, Any]]:
    return [r | {"payload": json.loads(r["payload"])} for r in stack.journal_rows() if r["operation_id"] == op]


def test_symlink_swapped_on_approved_does_not_change_what_runs(
    bstack: Stack, agent: pwd.struct_passwd, marks: Path
) -> None:
    home = Path(agent.pw_dir)
    mark = marks / "swap-pwned"
    evil, tool, fresh = home / "evil.sh", home / "tool", home / "tool.new"
    _payload(evil, agent, mark)

    # Control: the payload works as root, and the swapped link leads to it,
    # so a runner that resolves argv[0] again at spawn time would run it.
    subprocess.run([str(evil)], check=True)
    assert mark.exists()
    mark.unlink()

    for attempt in range(20):
        for path in (tool, fresh):
            path.unlink(missing_ok=True)
        run_as(agent, "ln", "-s", TRUE, str(tool))
        run_as(agent, "ln", "-s", str(evil), str(fresh))
        op = f"op-swap-{uuid.uuid4()}"
        lines = replies(
            agent_request(
                bstack.agent,
                agent,
                "exec",
                {"argv": [str(tool)], "stream": True, "operation_id": op},
                rename=(str(fresh), str(tool)),
            )
        )
        reply = final(lines)
        assert [line.get("event") for line in lines if "event" in line][:2] == ["accepted", "approved"]
        assert reply["ok"] is True, reply
        # The swap really happened during the request (the control for this try) ...
        assert os.path.realpath(tool) == str(evil), f"attempt {attempt}: the link was not swapped"
        # ... and what ran is what policy approved.
        assert reply["data"]["stages"][0]["resolved"] == TRUE
        trail = _journal(bstack, op)
        finished = [r for r in trail if r["kind"] == "exec.finished"]
        assert finished and finished[0]["payload"]["stages"][0]["resolved"] == TRUE
        started = [r for r in trail if r["kind"] == "exec.started"]
        assert started[0]["payload"]["binaries"][0]["ino"] == os.stat(TRUE).st_ino  # the journal says what was bound
        assert not mark.exists(), f"attempt {attempt}: the swapped-in payload ran as root"


def test_binary_replaced_while_pending_is_refused_as_binary_changed(
    bstack: Stack, agent: pwd.struct_passwd, marks: Path, tmp_path: Path
) -> None:
    home = Path(agent.pw_dir)
    tool, replacement = home / "tool-ask", home / "tool-ask.new"
    mark = home / "replaced-ran"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    os.chown(tool, agent.pw_uid, agent.pw_gid)
    _payload(replacement, agent, mark)
    op, request_id = f"op-replace-{uuid.uuid4()}", f"rq-{uuid.uuid4()}"
    proc = agent_request(
        bstack.agent,
        agent,
        "exec",
        {"argv": [str(tool)], "privileged": False, "operation_id": op},
        request_id=request_id,
    )
    pending = wait_pending(bstack, request_id, timeout=30)
    before = os.stat(tool)
    assert pending["binaries"][0]["ino"] == before.st_ino  # the operator sees the file that is bound

    run_as(agent, "mv", str(replacement), str(tool))  # while the operator looks
    after = os.stat(tool)
    assert (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino)  # control: another file at the same path
    assert bstack.cli("approve", request_id).returncode == 0

    reply = final(replies(proc))
    assert reply["ok"] is False and reply["error"]["code"] == "binary_changed", reply
    assert not mark.exists()
    refused = [r["payload"] for r in _journal(bstack, op) if r["kind"] == "exec.refused"]
    assert refused and refused[0]["code"] == "binary_changed"
    run_as(agent, str(tool))  # control: the replacement itself runs fine when the agent starts it
    assert mark.exists()


def test_root_job_binary_the_agent_can_rewrite_is_unsafe(bstack: Stack, agent: pwd.struct_passwd, marks: Path) -> None:
    home = Path(agent.pw_dir)
    tool = home / "tool-inplace"
    mark = marks / "inplace-pwned"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    os.chown(tool, agent.pw_uid, agent.pw_gid)

    # Control: the agent can rewrite its binary in place, and device and inode
    # stay the same, so an identity check alone would not notice.
    before = os.stat(tool)
    run_as(agent, "sh", "-c", f"printf '#!/bin/sh\\ntouch {mark}\\n' > {tool}")
    after = os.stat(tool)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino) and b"touch" in tool.read_bytes()

    op = f"op-inplace-{uuid.uuid4()}"
    reply = agent_exec(bstack.agent, agent, {"argv": [str(tool)], "privileged": True, "operation_id": op})
    assert reply["ok"] is False and reply["error"]["code"] == "unsafe_binary", reply
    assert reply["error"]["details"]["path"] == agent.pw_dir  # the agent's home: not root's alone
    assert not mark.exists()
    trail = _journal(bstack, op)
    assert not [r for r in trail if r["kind"] == "exec.started"]
    replied = [r["payload"] for r in trail if r["kind"] == "request.replied"]
    assert replied and replied[-1]["code"] == "unsafe_binary"  # the refusal is in the audit trail
