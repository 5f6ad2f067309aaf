"""The operator is shown what will run (issue 14): the pending view tells the truth.

A privileged file operation must not be listed as running as the agent, and
an exec request shows the binary the ticket binds (path, device, inode).
"""

from __future__ import annotations

import os
import pwd
import uuid
from collections.abc import Iterator

import pytest
from secsupport import agent_request, final, needs_root, red_stack, replies, throwaway_user

from support import Stack, wait_pending

pytestmark = needs_root


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alpend") as user:
        yield user


@pytest.fixture(scope="module")
def pstack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    config = f"""
agents:
  users: [root, {agent.pw_name}]
policy:
  default: deny
  rules:
    - name: read-etc-asks
      decision: ask
      users: [{agent.pw_name}]
      files: [{{tools: [files_read], paths: [/etc/...]}}]
    - name: true-asks
      decision: ask
      users: [{agent.pw_name}]
      commands: [[/usr/bin/true]]
"""
    with red_stack(config) as stack:
        yield stack


def test_a_privileged_file_operation_is_shown_as_root(pstack: Stack, agent: pwd.struct_passwd) -> None:
    request_id = f"rq-{uuid.uuid4()}"
    proc = agent_request(
        pstack.agent, agent, "files_read", {"path": "/etc/hostname", "privileged": True}, request_id=request_id
    )
    try:
        item = wait_pending(pstack, request_id, timeout=30)
        # Control: a file request carries no "spec", which is all the view used to read.
        assert "spec" not in item["request"] and item["request"]["tool"] == "files_read"
        assert item["privileged"] is True
        assert item["run_as"] == {"uid": 0, "user": "root"}
        listing = pstack.cli("pending")
        row = next(line for line in listing.stdout.splitlines() if line.startswith(request_id))
        assert row.split()[1:3] == [agent.pw_name, "root"], listing.stdout
    finally:
        pstack.cli("deny", request_id)
    assert final(replies(proc))["error"]["code"] == "denied"


def test_an_unprivileged_file_operation_is_shown_as_the_agent(pstack: Stack, agent: pwd.struct_passwd) -> None:
    request_id = f"rq-{uuid.uuid4()}"
    proc = agent_request(
        pstack.agent, agent, "files_read", {"path": "/etc/hostname", "privileged": False}, request_id=request_id
    )
    try:
        item = wait_pending(pstack, request_id, timeout=30)
        assert item["privileged"] is False and item["run_as"] == {"uid": agent.pw_uid, "user": agent.pw_name}
    finally:
        pstack.cli("deny", request_id)
    replies(proc)


def test_a_pending_exec_shows_the_bound_binary(pstack: Stack, agent: pwd.struct_passwd) -> None:
    request_id = f"rq-{uuid.uuid4()}"
    proc = agent_request(pstack.agent, agent, "exec", {"argv": ["true"], "privileged": True}, request_id=request_id)
    try:
        item = wait_pending(pstack, request_id, timeout=30)
        real = os.path.realpath("/usr/bin/true")
        st = os.stat(real)
        assert item["privileged"] is True and item["run_as"]["user"] == "root"
        assert item["binaries"] == [{"path": real, "dev": st.st_dev, "ino": st.st_ino, "uid": 0, "mode": st.st_mode}]
        assert item["stages"][0]["resolved"] == real and item["stages"][0]["identity"]["ino"] == st.st_ino
    finally:
        pstack.cli("deny", request_id)
    replies(proc)
