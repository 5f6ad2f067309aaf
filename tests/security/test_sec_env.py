"""Attacks through a root job's environment (issue 14): PATH and HOME injection.

Even with PATH and HOME added to ``env.allow`` by an operator, a root job's
PATH, HOME (and USER, LOGNAME, SHELL) come from root's passwd entry and the
secure path; a request naming one is refused, never silently dropped.  And a
bare name is never looked up on the request's PATH.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root

GIT = shutil.which("git")


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alenv") as user:
        yield user


@pytest.fixture(scope="module")
def repo(marks: Path) -> Path:
    path = marks / "repo"
    path.mkdir()
    if GIT is not None:
        subprocess.run([GIT, "-C", str(path), "init", "-q"], check=True)
        (path / "f").write_text("x\n")
        subprocess.run([GIT, "-C", str(path), "add", "f"], check=True)
    return path


@pytest.fixture(scope="module")
def estack(agent: pwd.struct_passwd, repo: Path) -> Iterator[Stack]:
    config = f"""
agents:
  users: [root, {agent.pw_name}]
env:
  allow: [LANG, TZ, TERM, LC_*, PATH, HOME, USER, LOGNAME, SHELL, LD_PRELOAD]  # an operator widened it
policy:
  default: deny
  rules:
    - name: allow-true
      decision: allow
      users: [{agent.pw_name}]
      commands: [[/usr/bin/true]]
    - name: git-status
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      commands: [[/usr/bin/git, -C, {repo}, status]]
"""
    with red_stack(config) as stack:
        yield stack


def _evil(path: Path, user: pwd.struct_passwd, mark: Path) -> None:
    path.parent.mkdir(exist_ok=True)
    os.chown(path.parent, user.pw_uid, user.pw_gid)
    path.write_text(f"#!/bin/sh\ntouch {mark}\n")
    path.chmod(0o755)
    os.chown(path, user.pw_uid, user.pw_gid)


def test_path_from_the_request_never_picks_the_binary(estack: Stack, agent: pwd.struct_passwd, marks: Path) -> None:
    bin_dir = Path(agent.pw_dir) / "bin"
    root_mark, own_mark = marks / "path-pwned", Path(agent.pw_dir) / "path-ran"
    _evil(bin_dir / "true", agent, root_mark)
    path = f"{bin_dir}:/usr/bin:/bin"
    # Control: on that PATH, `true` is the agent's payload.
    assert shutil.which("true", path=path) == str(bin_dir / "true")

    # A root job: PATH is not the request's to set.
    reply = agent_exec(estack.agent, agent, {"argv": ["true"], "env": {"PATH": path}, "privileged": True})
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_arguments", reply
    assert reply["error"]["details"]["field"] == "env.PATH"
    assert not root_mark.exists()

    # An unprivileged job may carry a PATH, but argv[0] is still what policy matched.
    (bin_dir / "true").write_text(f"#!/bin/sh\ntouch {own_mark}\n")
    reply = agent_exec(estack.agent, agent, {"argv": ["true"], "env": {"PATH": path}, "privileged": False})
    assert reply["ok"] is True, reply
    assert reply["data"]["stages"][0]["resolved"] == os.path.realpath("/usr/bin/true")
    assert not own_mark.exists()


@pytest.mark.parametrize("name", ["HOME", "USER", "LOGNAME", "SHELL", "LD_PRELOAD"])
def test_a_root_job_refuses_reset_and_dangerous_variables(estack: Stack, agent: pwd.struct_passwd, name: str) -> None:
    reply = agent_exec(estack.agent, agent, {"argv": ["/usr/bin/true"], "env": {name: "/tmp/x"}, "privileged": True})
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_arguments", reply
    assert reply["error"]["details"]["field"] == f"env.{name}"
    # Control: the same request without it is allowed and runs.
    assert agent_exec(estack.agent, agent, {"argv": ["/usr/bin/true"], "privileged": True})["ok"] is True


@pytest.mark.skipif(GIT is None, reason="git is not installed (apt-get install git)")
def test_home_injection_cannot_run_the_agents_git_fsmonitor_as_root(
    estack: Stack, agent: pwd.struct_passwd, marks: Path, repo: Path
) -> None:
    assert GIT is not None
    home = Path(agent.pw_dir)
    mark = marks / "fsmonitor-pwned"
    _evil(home / "hooks" / "fsmon.sh", agent, mark)
    (home / ".gitconfig").write_text(f"[core]\n\tfsmonitor = {home / 'hooks' / 'fsmon.sh'}\n")
    os.chown(home / ".gitconfig", agent.pw_uid, agent.pw_gid)

    # Control: root's git with the agent's HOME runs the agent's fsmonitor.
    subprocess.run(
        [GIT, "-C", str(repo), "status"],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=True,
    )
    assert mark.exists()
    mark.unlink()

    argv = ["git", "-C", str(repo), "status"]
    reply = agent_exec(
        estack.agent,
        agent,
        {"argv": argv, "env": {"HOME": str(home)}, "privileged": True, "operation_id": f"op-home-{uuid.uuid4()}"},
    )
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_arguments", reply
    assert reply["error"]["details"]["field"] == "env.HOME"
    assert not mark.exists()

    # The approved command itself runs, with root's own HOME.
    reply = agent_exec(estack.agent, agent, {"argv": argv, "privileged": True})
    assert reply["ok"] is True and reply["data"]["stages"][0]["exit_code"] == 0, reply
    assert not mark.exists()
