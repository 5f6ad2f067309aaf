"""An agent account with no sudo rights types `sudo` (issue 48): the package's sudo, first on its PATH alone.

The agent builds a tiny package and types `sudo apt-get install -y ./hello.deb`
in a login shell; an operator approves; the package is installed.  With a
rule's run_as naming nobody, `sudo -u nobody id -un` prints `nobody`.  People
(the operator) and root keep the real sudo on their PATH.
"""

from __future__ import annotations

import json
import time

import pytest

AGENT_SUDO = "/usr/lib/airlock/agent-bin/sudo"
CONTROL = """\
Package: hello-airlock
Version: 1.0
Architecture: all
Maintainer: airlock system tests <root@localhost>
Description: a tiny package an agent installs through airlock's sudo
"""
RUN_AS = """\
rules:
  - name: systest-sudo-as-nobody
    decision: allow
    groups: [airlock]
    run_as: [nobody]
    commands: [[/usr/bin/id, "..."]]
"""


def _login(system, script: str, user: str):
    """``script`` in the login shell of ``user`` (/etc/profile and /etc/profile.d as a person's shell reads them)."""
    return system.c.run(["bash", "-lc", script], user=user, check=False, timeout=120)


def _pending(system) -> list[dict]:
    r = system.airlock("pending", "--json", user=system.OPERATOR, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["data"]["pending"]


def test_only_agents_find_airlocks_sudo_first(system) -> None:
    assert _login(system, "command -v sudo", system.AGENT).stdout.strip() == AGENT_SUDO
    for user in (system.OPERATOR, system.OUTSIDER):
        assert AGENT_SUDO not in _login(system, "echo $PATH", user).stdout
    assert AGENT_SUDO not in system.c.run(["bash", "-lc", "echo $PATH"]).stdout


def test_an_agent_installs_a_package_with_sudo_once_an_operator_approves(system) -> None:
    build = (
        "set -e; mkdir -p ~/hello/DEBIAN ~/hello/usr/share/hello-airlock; "
        "cat > ~/hello/DEBIAN/control; echo hello > ~/hello/usr/share/hello-airlock/hello; "
        "dpkg-deb --root-owner-group --build ~/hello ~/hello.deb"
    )
    system.c.run(["sh", "-c", build], user=system.AGENT, input=CONTROL)
    assert system.c.run(["dpkg-query", "-W", "hello-airlock"], check=False).returncode != 0
    proc = system.c.popen(["bash", "-lc", "cd ~ && sudo apt-get install -y ./hello.deb"], user=system.AGENT)
    try:
        deadline = time.monotonic() + 30
        asked = []
        while not asked and time.monotonic() < deadline:
            asked = [p for p in _pending(system) if p["stages"][0]["argv"][:2] == ["apt-get", "install"]]
            time.sleep(0.2)
        assert asked, "the agent's sudo never asked"
        assert asked[0]["run_as"]["user"] == "root" and asked[0]["peer"]["user"] == system.AGENT
        r = system.airlock("approve", asked[0]["request_id"], "--reason", "systest", user=system.OPERATOR)
        assert r.returncode == 0, r
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, (out, err)
        assert b"waiting for an operator" in err
        assert system.c.run(["dpkg-query", "-W", "-f=${Version}", "hello-airlock"]).stdout == "1.0"
    finally:
        if proc.poll() is None:
            proc.kill()
        system.c.run(["apt-get", "purge", "-y", "hello-airlock"], check=False, timeout=120)


@pytest.fixture
def run_as_nobody(system):
    system.c.write("/etc/airlock/policy.d/60-systest-sudo.yaml", RUN_AS)
    system.c.run(["systemctl", "reload", "airlock-approval.service"], check=False)
    yield
    system.c.run(["rm", "-f", "/etc/airlock/policy.d/60-systest-sudo.yaml"])
    system.c.run(["systemctl", "reload", "airlock-approval.service"], check=False)


def test_sudo_u_nobody(system, run_as_nobody) -> None:
    r = _login(system, "sudo -u nobody id -un", system.AGENT)
    assert (r.returncode, r.stdout) == (0, "nobody\n"), r
    # Root stays the default, and a rule without run_as (systest-root-commands) still allows it.
    r = _login(system, "sudo -n id -un", system.AGENT)
    assert (r.returncode, r.stdout) == (0, "root\n"), r
