"""A rule's credentials are never readable by the requester's uid (issue 51), against a live stack.

systemd's copy of a credential (``$CREDENTIALS_DIRECTORY``) belongs to the
job's uid: a job that runs as the agent itself hands the value to every other
process of the agent.  So:

1. A policy with ``credentials:`` on a rule that can match an unprivileged
   request (no ``privileged: true``) does not load: ``airlock dev up`` refuses
   to start, naming path:line:col.  Control: the same rule with
   ``privileged: true`` loads, and the agent's unprivileged request is not
   covered by it.
2. The runner refuses, before reading a value, a job with credentials whose
   uid is the requester's (here: root asking for a root job, which policy
   allows).  Control: another agent's root job under the same rule passes
   that check and stops only at "needs service containment" (this stack's
   process-group mode; tests/system/test_7_output.py runs it for real).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

pytestmark = needs_root

RULE = """
agents:
  users: [{agents}]
policy:
  default: deny
  rules:
    - name: with-credential
      decision: allow
{privileged}      commands: [[/usr/bin/cat, "..."]]
      credentials:
        db: {path}
"""


@pytest.fixture
def credential() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="alsec-cred", dir="/tmp"))
    os.chmod(where, 0o755)
    path = where / "db.pass"
    path.write_text(f"credential-{secrets.token_hex(12)}\n")
    os.chmod(path, 0o600)
    try:
        yield path
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def alice() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alcreda") as a:
        yield a


def test_credentials_on_a_rule_an_unprivileged_request_can_match_do_not_load(
    alice: pwd.struct_passwd, credential: Path, tmp_path: Path
) -> None:
    config = tmp_path / "airlock.yaml"
    config.write_text(RULE.format(agents=alice.pw_name, privileged="", path=credential))
    runtime = Path(tempfile.mkdtemp(prefix="alsec", dir="/tmp"))
    argv = [sys.executable, "-m", "airlock", "dev", "up", "--runtime-dir", str(runtime), "--config", str(config)]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        said, _ = up.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # it started on that policy: stop it and its services
        os.killpg(up.pid, signal.SIGTERM)
        said, _ = up.communicate(timeout=60)
        pytest.fail(f"airlock dev up started on a policy handing credentials to the agent's own uid:\n{said}")
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert up.returncode != 0, said
    assert (
        f"{config}:11:9: policy.rules[0] (with-credential).credentials: apply only to a rule with privileged: true"
        in said
    ), said
    # Control: the same rule for root jobs only loads; the agent's own-uid request is not covered by it.
    privileged = "      privileged: true\n"
    with red_stack(RULE.format(agents=alice.pw_name, privileged=privileged, path=credential)) as stack:
        mine = agent_exec(stack.agent, alice, {"argv": ["cat", "/etc/hostname"], "privileged": False})
        assert not mine["ok"] and mine["error"]["code"] == "denied", mine
        root = agent_exec(stack.agent, alice, {"argv": ["cat", "/etc/hostname"], "privileged": True})
        assert not root["ok"] and "runner.containment: service" in root["error"]["message"], root


def test_the_runner_refuses_credentials_for_a_job_that_runs_as_its_requester(
    alice: pwd.struct_passwd, credential: Path
) -> None:
    root = pwd.getpwuid(0)
    privileged = "      privileged: true\n"
    with red_stack(RULE.format(agents=f"{alice.pw_name}, root", privileged=privileged, path=credential)) as stack:
        same = agent_exec(stack.agent, root, {"argv": ["cat", "/etc/hostname"], "privileged": True})
        assert not same["ok"] and same["error"]["code"] == "credential_unsafe", same
        assert "readable by the requester" in same["error"]["message"], same
        # Control: alice's root job under the same rule passes this check (and stops at containment).
        other = agent_exec(stack.agent, alice, {"argv": ["cat", "/etc/hostname"], "privileged": True})
        assert not other["ok"] and "runner.containment: service" in other["error"]["message"], other
