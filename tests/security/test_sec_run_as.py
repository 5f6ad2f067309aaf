"""Attacks through ``user`` (issue 48: sudo -u, a rule's run_as): another account is never a backdoor.

1. A rule written for root (``privileged: true``, any argument) does not let a
   job run as another account: without a run_as that names it, the policy's
   default decides (here: deny). Control: the same rule runs it as root.
2. A rule's run_as names one account; a request for another is not allowed by it.
3. A job as another account keeps a root job's environment rules: a loader
   variable an operator admitted to env.allow is still refused.
4. A job as another account runs only binaries root's alone: the agent's own
   executable, allowed by a run_as rule, is ``unsafe_binary`` and never runs
   (as it would for root). Control: the same file runs as the agent itself.
"""

from __future__ import annotations

import base64
import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_exec, needs_root, red_stack, root_dir, throwaway_user

from support import Stack

pytestmark = needs_root


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alrun") as user:
        yield user


@pytest.fixture(scope="module")
def rstack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    config = f"""
agents:
  users: [{agent.pw_name}]
env:
  allow: [LANG, LD_PRELOAD]
policy:
  default: deny
  rules:
    - name: anything-as-root
      decision: allow
      privileged: true
      commands: [[/usr/bin/id, "..."], [/usr/bin/touch, "..."]]
    - name: ids-as-nobody
      decision: allow
      run_as: [nobody]
      commands: [[/usr/bin/id, "..."], ["{agent.pw_dir}/tool", "..."]]
    - name: own-tool
      decision: allow
      privileged: false
      commands: [["{agent.pw_dir}/tool", "..."]]
"""
    with red_stack(config) as stack:
        yield stack


def _stdout(reply: dict[str, Any]) -> str:
    return base64.b64decode(reply["data"]["stdout"]).decode()


def test_a_rule_for_root_does_not_run_a_job_as_another_account(rstack: Stack, agent: pwd.struct_passwd) -> None:
    mark = root_dir() / "as-www-data"
    refused = agent_exec(rstack.agent, agent, {"argv": ["touch", str(mark)], "user": "www-data"})
    assert refused["ok"] is False and refused["error"]["code"] == "denied", refused
    assert not mark.exists()
    # Control: the very rule runs it as root.
    ran = agent_exec(rstack.agent, agent, {"argv": ["touch", str(mark)]})
    assert ran["ok"] is True and mark.stat().st_uid == 0


def test_run_as_names_the_accounts_it_allows(rstack: Stack, agent: pwd.struct_passwd) -> None:
    ran = agent_exec(rstack.agent, agent, {"argv": ["id", "-un"], "user": "nobody"})
    assert ran["ok"] is True and _stdout(ran) == "nobody\n"
    other = agent_exec(rstack.agent, agent, {"argv": ["id", "-un"], "user": "daemon"})
    assert other["ok"] is False and other["error"]["code"] == "denied", other


def test_another_accounts_job_keeps_root_jobs_environment_rules(rstack: Stack, agent: pwd.struct_passwd) -> None:
    args = {"argv": ["id", "-un"], "user": "nobody", "env": {"LD_PRELOAD": "/tmp/x.so"}}
    refused = agent_exec(rstack.agent, agent, args)
    assert refused["ok"] is False and refused["error"]["details"]["field"] == "env.LD_PRELOAD", refused
    # Control: the allowlist admits it for the agent's own job.
    mine = agent_exec(rstack.agent, agent, {"argv": ["id", "-un"], "privileged": False, "env": {"LANG": "C"}})
    assert mine["ok"] is True


def test_another_accounts_job_runs_only_binaries_roots_alone(rstack: Stack, agent: pwd.struct_passwd) -> None:
    tool = Path(agent.pw_dir) / "tool"
    mark = Path(agent.pw_dir) / "tool-ran"
    tool.write_text(f"#!/bin/sh\nid -un > {mark}\n")
    tool.chmod(0o755)
    os.chown(tool, agent.pw_uid, agent.pw_gid)
    os.chmod(agent.pw_dir, 0o755)  # nobody may enter: the binary is refused for its owner, not for the path
    refused = agent_exec(rstack.agent, agent, {"argv": [str(tool)], "user": "nobody"})
    assert refused["ok"] is False and refused["error"]["code"] == "unsafe_binary", refused
    assert not mark.exists()
    # Control: the same file runs as the agent itself.
    mine = agent_exec(rstack.agent, agent, {"argv": [str(tool)], "privileged": False})
    assert mine["ok"] is True and mark.read_text() == f"{agent.pw_name}\n"
