"""Attack 6 of issue 27: a rule's name decided whose ``sandbox:`` a job got.

Among rules with the same decision the alphabetically smaller one used to
decide alone, so adding an unconfined allow rule named ``log-readers`` dropped
``web-logs``' sandbox from the same root request: the job ran unconfined.
Now the sandboxes of every rule with the winning decision merge, most
restrictive per key, whatever the names.  (Under ``airlock dev up`` there is
no systemd: a job whose merged sandbox confines anything is refused with
``spawn_failed`` rather than run unconfined; under systemd it runs read-only.
Either way nothing is written.)
"""

from __future__ import annotations

import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alsbx") as user:
        yield user


@pytest.fixture(scope="module")
def mstack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    config = f"""
agents:
  users: [root, {agent.pw_name}]
policy:
  default: deny
  rules:
    - name: web-logs
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      commands: [[/usr/bin/touch, "{{file}}"]]
      sandbox: {{read_only: true, private_network: true}}
    # Added later by someone else, for other uses; its name sorts first.
    - name: log-readers
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      commands: [[/usr/bin/touch, "..."]]
"""
    with red_stack(config) as stack:
        yield stack


def _wrote_nothing(reply: dict[str, object], mark: Path) -> None:
    assert not mark.exists(), reply
    if reply["ok"]:  # under systemd: it ran, read-only
        assert reply["data"]["stages"][0]["exit_code"] != 0, reply  # type: ignore[index]
    else:
        assert reply["error"]["code"] == "spawn_failed", reply  # type: ignore[index]
        assert "sandbox" in reply["error"]["message"]  # type: ignore[index]


def test_an_unconfined_rule_named_first_does_not_drop_the_sandbox(
    mstack: Stack, agent: pwd.struct_passwd, marks: Path
) -> None:
    control = marks / "control"
    # Control: a request only log-readers matches runs as root, unconfined, and writes.
    reply = agent_exec(mstack.agent, agent, {"argv": ["/usr/bin/touch", "-m", str(control)], "privileged": True})
    assert reply["ok"] is True and reply["data"]["stages"][0]["exit_code"] == 0, reply
    assert control.exists()

    # The attack: both rules match; web-logs' sandbox must hold although log-readers' name sorts first.
    mark = marks / "unconfined"
    reply = agent_exec(mstack.agent, agent, {"argv": ["/usr/bin/touch", str(mark)], "privileged": True})
    _wrote_nothing(reply, mark)

    # What `airlock policy check` shows the operator: the merged sandbox, and which rules it comes from.
    shown = mstack.cli("policy", "check", "--user", agent.pw_name, "--", "/usr/bin/touch", str(mark))
    assert shown.returncode == 0, shown.stderr
    assert "sandbox: private_network=True; read_only=True" in shown.stdout, shown.stdout
    assert "log-readers, web-logs" in shown.stdout, shown.stdout
