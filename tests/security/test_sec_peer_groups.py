"""Policy judges the groups the agent's process really has, as the agent door does.

intake admits an agent by the groups the kernel reports for its process
(SO_PEERGROUPS); approval used to rebuild them from the user database, so a
rule's ``groups:`` condition judged other groups than the door: a group
granted to a process (``SupplementaryGroups=``, ``newgrp``, ``sg``) was
ignored, and a group removed from a user's running session still counted.
Now the groups read at accept travel with the request.
"""

from __future__ import annotations

import grp
import pwd
import secrets
import subprocess
from collections.abc import Iterator

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root


@pytest.fixture(scope="module")
def group() -> Iterator[grp.struct_group]:
    name = f"alsecg{secrets.token_hex(3)}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield grp.getgrnam(name)
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("algrp") as user:
        yield user


@pytest.fixture(scope="module")
def gstack(agent: pwd.struct_passwd, group: grp.struct_group) -> Iterator[Stack]:
    config = f"""
agents:
  users: [root, {agent.pw_name}]
policy:
  default: deny
  rules:
    - name: by-group
      decision: allow
      privileged: false
      groups: [{group.gr_name}]
      commands: [[/usr/bin/true]]
"""
    with red_stack(config) as stack:
        yield stack


def test_a_group_the_process_has_counts_for_policy(
    gstack: Stack, agent: pwd.struct_passwd, group: grp.struct_group
) -> None:
    assert agent.pw_name not in group.gr_mem  # the user database does not put the agent in the group
    # Control: without the group, the rule does not apply and the default denies.
    denied = agent_exec(gstack.agent, agent, {"argv": ["/usr/bin/true"], "privileged": False})
    assert denied["ok"] is False and denied["error"]["code"] == "denied", denied
    allowed = agent_exec(gstack.agent, agent, {"argv": ["/usr/bin/true"], "privileged": False}, groups=[group.gr_gid])
    assert allowed["ok"] is True, allowed
    assert allowed["data"]["decision"]["rule"] == "by-group"
