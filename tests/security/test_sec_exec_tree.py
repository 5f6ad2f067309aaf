"""A job cannot hide what it ran from the exec tree by renaming itself (issue 35).

Attack: an approved ``bash -c`` job executes ``/usr/bin/sleep`` under the
argv[0] ``sshd: innocent`` (``exec -a``), the way a process passes for
another in ``ps``.  The exec tree the operator reads names the file the
kernel executed (path, device, inode) next to the argv the process chose, and
the uid it ran as.  Control: the same job without the rename shows argv[0]
as the path, so the tree does show what a process says when it tells the
truth.  The tree is the operator's: the agent's reply does not carry it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root


@pytest.fixture(scope="module")
def alice() -> Iterator[Any]:
    with throwaway_user("altra") as user:
        yield user


@pytest.fixture(scope="module")
def tstack(alice: Any) -> Iterator[Stack]:
    config = f"""
agents:
  users: [{alice.pw_name}]
policy:
  default: deny
  rules:
    - name: bash
      decision: allow
      users: [{alice.pw_name}]
      privileged: false
      commands: [[/usr/bin/bash, "..."]]
"""
    with red_stack(config) as stack:
        yield stack


def _tree(stack: Stack, rid: str) -> dict[str, Any]:
    done = stack.cli("show", rid, "--json")
    assert done.returncode == 0, done.stderr
    tree: dict[str, Any] = json.loads(done.stdout)["data"]["tree"]
    if tree.get("unavailable"):
        pytest.skip(f"no exec tree here: {tree['unavailable']}")
    return tree


@pytest.mark.parametrize("renamed", [True, False])
def test_a_renamed_program_is_named_by_the_file_the_kernel_ran(tstack: Stack, alice: Any, renamed: bool) -> None:
    rid = f"rn-{uuid.uuid4()}"
    script = "exec -a 'sshd: innocent' /usr/bin/sleep 0.2" if renamed else "exec /usr/bin/sleep 0.2"
    reply = agent_exec(tstack.agent, alice, {"argv": ["bash", "-c", script], "privileged": False}, request_id=rid)
    assert reply["ok"] is True, reply
    assert "tree" not in reply["data"]
    last = _tree(tstack, rid)["processes"][-1]
    sleep = os.stat("/usr/bin/sleep")
    assert (last["exe_id"]["dev"], last["exe_id"]["ino"]) == (sleep.st_dev, sleep.st_ino)
    assert last["uid"] == alice.pw_uid
    if last.get("exited_before_read"):  # named by the kernel's exit record instead
        assert last["comm"] == "sleep"
        return
    assert last["exe"] == os.path.realpath("/usr/bin/sleep")
    assert last["argv"][0] == ("sshd: innocent" if renamed else "/usr/bin/sleep")
    shown = tstack.cli("show", rid).stdout
    assert f"[{os.path.realpath('/usr/bin/sleep')} dev {sleep.st_dev} ino {sleep.st_ino} uid {alice.pw_uid}" in shown
