"""Attack 9 of issue 27: loader, hook and config variables an operator's wider ``env.allow`` let through.

With names such as ``APT_CONFIG`` listed in ``env.allow`` (or admitted by
``APT_*``), policy.md's own ``apt-get update`` rule ran the agent's
``APT::Update::Pre-Invoke`` hook as root, and ``TZ`` pointed a root job at a
file the agent wrote.  Now every such name is refused for a root job whatever
``env.allow`` says, ``TZ`` is checked as sudo checks it, and a wildcard that
would admit a denied name does not load.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root

APT_GET = shutil.which("apt-get")
HOOKED = [
    "APT_CONFIG",
    "SYSTEMD_EDITOR",
    "RSYNC_RSH",
    "VIMINIT",
    "EXINIT",
    "LUA_INIT",
    "_JAVA_OPTIONS",
    "JAVA_TOOL_OPTIONS",
    "NODE_OPTIONS",
    "RUBYOPT",
    "SSLKEYLOGFILE",
    "OPENSSL_MODULES",
    "OPENSSL_CONF",
]


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alhook") as user:
        yield user


@pytest.fixture(scope="module")
def hstack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    # An operator listed each name: the rule in policy.md (apt-refresh) and a root `date`.
    config = f"""
agents:
  users: [root, {agent.pw_name}]
env:
  allow: [LANG, TZ, TERM, LC_*, {", ".join(HOOKED)}]
policy:
  default: deny
  rules:
    - name: apt-refresh
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      commands: [[/usr/bin/apt-get, update]]
    - name: clock
      decision: allow
      users: [{agent.pw_name}]
      commands: [[/usr/bin/date, +%Z]]
"""
    with red_stack(config) as stack:
        yield stack


def _apt_conf(agent: pwd.struct_passwd, mark: Path, lists: Path) -> Path:
    """The agent's apt configuration: a hook, and no network (no sources, lists in a scratch folder)."""
    conf = Path(agent.pw_dir) / "apt.conf"
    conf.write_text(
        f'APT::Update::Pre-Invoke {{ "touch {mark}"; }};\n'
        'Dir::Etc::sourcelist "/dev/null";\n'
        'Dir::Etc::sourceparts "/nonexistent";\n'
        f'Dir::State::Lists "{lists}";\n'
    )
    os.chown(conf, agent.pw_uid, agent.pw_gid)
    return conf


@pytest.mark.skipif(APT_GET is None, reason="apt-get is not installed")
def test_apt_config_cannot_hook_policy_mds_apt_get_update(hstack: Stack, agent: pwd.struct_passwd, marks: Path) -> None:
    mark = marks / "apt-hook-pwned"
    lists = Path(tempfile.mkdtemp(prefix="alsec-lists", dir=marks))
    (lists / "partial").mkdir()
    conf = _apt_conf(agent, mark, lists)
    # Control: root's apt-get update with the agent's APT_CONFIG runs the agent's hook.
    subprocess.run(
        [str(APT_GET), "update"],
        env={"APT_CONFIG": str(conf), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert mark.exists()
    mark.unlink()

    reply = agent_exec(
        hstack.agent, agent, {"argv": ["apt-get", "update"], "env": {"APT_CONFIG": str(conf)}, "privileged": True}
    )
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_arguments", reply
    assert reply["error"]["details"]["field"] == "env.APT_CONFIG"
    assert not mark.exists()


@pytest.mark.parametrize("name", HOOKED)
def test_each_listed_loader_or_hook_variable_is_refused_for_a_root_job(
    hstack: Stack, agent: pwd.struct_passwd, name: str
) -> None:
    given = {"argv": ["/usr/bin/date", "+%Z"], "env": {name: f"{agent.pw_dir}/x"}}
    reply = agent_exec(hstack.agent, agent, given | {"privileged": True})
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_arguments", reply
    assert reply["error"]["details"]["field"] == f"env.{name}"
    # Control: env.allow admits it, so the agent's own (unprivileged) job takes it.
    assert agent_exec(hstack.agent, agent, given | {"privileged": False})["ok"] is True


def test_tz_cannot_point_a_root_job_at_the_agents_file(hstack: Stack, agent: pwd.struct_passwd) -> None:
    zone = Path(agent.pw_dir) / "zone"
    shutil.copyfile("/usr/share/zoneinfo/Asia/Kolkata", zone)
    os.chown(zone, agent.pw_uid, agent.pw_gid)
    # Control: root's date reads whatever file TZ names.
    shown = subprocess.run(["/usr/bin/date", "+%Z"], env={"TZ": f":{zone}"}, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "IST"

    for value in (f":{zone}", str(zone), "/usr/share/zoneinfo/../../.." + str(zone)):
        args = {"argv": ["/usr/bin/date", "+%Z"], "env": {"TZ": value}, "privileged": True}
        reply = agent_exec(hstack.agent, agent, args)
        assert reply["ok"] is False and reply["error"]["details"]["field"] == "env.TZ", reply

    # A time zone by name still reaches a root job.
    reply = agent_exec(
        hstack.agent, agent, {"argv": ["/usr/bin/date", "+%Z"], "env": {"TZ": "Asia/Kolkata"}, "privileged": True}
    )
    assert reply["ok"] is True, reply
    assert reply["data"]["stages"][0]["exit_code"] == 0


def test_a_wildcard_that_admits_a_denied_name_does_not_load(tmp_path: Path) -> None:
    bad = tmp_path / "airlock.yaml"
    bad.write_text("env:\n  allow: [LANG, LC_*, APT_*]\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "airlock", "config", "show", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert f"{bad}:2:23: env.allow[2]: 'APT_*' admits names a privileged job may never set" in done.stderr
    # Control: the same file with the names listed loads.
    bad.write_text("env:\n  allow: [LANG, LC_*, DEBIAN_FRONTEND]\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "airlock", "config", "show", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
