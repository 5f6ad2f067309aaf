"""Intake's environment rule for root jobs (issue 14), checked without a socket."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime

import pytest

from airlock.common import config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.intake.request import native_exec

AGENT = Peer(pid=1, uid=1000, gid=1000, user="agent", group_ids=(1000,), groups=frozenset({"agent"}))


def _wide() -> config.Config:
    """Defaults, with an operator's too-wide env.allow."""
    base = config.defaults()
    return dataclasses.replace(base, env=dataclasses.replace(base.env, allow=("HOME", "PATH", "LANG", "LD_*")))


def _exec(env: dict[str, str], *, privileged: bool, cfg: config.Config | None = None) -> None:
    now = time.time()
    stamp = datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z")
    args = {"argv": ["true"], "privileged": privileged, "env": env, "time": stamp}
    native_exec("r1", args, AGENT, cfg or _wide(), now)


@pytest.mark.parametrize("name", ["HOME", "PATH", "LD_PRELOAD"])
def test_a_root_job_refuses_the_variable_by_name_even_if_allowed(name: str) -> None:
    with pytest.raises(AirlockError) as err:
        _exec({name: "/home/agent"}, privileged=True)
    assert err.value.code is ErrorCode.INVALID_ARGUMENTS and err.value.details == {"field": f"env.{name}"}


def test_an_unprivileged_job_takes_what_env_allow_admits() -> None:
    _exec({"HOME": "/home/agent", "PATH": "/home/agent/bin:/usr/bin"}, privileged=False)


def test_home_is_no_longer_in_the_default_allowlist() -> None:
    assert "HOME" not in config.defaults().env.allow
    with pytest.raises(AirlockError) as err:
        _exec({"HOME": "/home/agent"}, privileged=False, cfg=config.defaults())
    assert err.value.details == {"field": "env.HOME"}


def _wider(*names: str) -> config.Config:
    base = config.defaults()
    return dataclasses.replace(base, env=dataclasses.replace(base.env, allow=names))


# Issue 27 item 9: names that once passed for root jobs once an operator listed them.
ISSUE_27 = [
    "APT_CONFIG",
    "SYSTEMD_EDITOR",
    "RSYNC_RSH",
    "VIMINIT",
    "EXINIT",
    "LUA_INIT",
    "LUA_INIT_5_4",
    "_JAVA_OPTIONS",
    "JAVA_TOOL_OPTIONS",
    "NODE_OPTIONS",
    "RUBYOPT",
    "SSLKEYLOGFILE",
    "OPENSSL_MODULES",
    "OPENSSL_CONF",
    "DPKG_PAGER",
    "PERL5SHELL",
    "BASH_LOADABLES_PATH",
]


@pytest.mark.parametrize("name", ISSUE_27)
def test_a_root_job_refuses_each_loader_hook_and_config_variable(name: str) -> None:
    with pytest.raises(AirlockError) as err:
        _exec({name: "/home/agent/x"}, privileged=True, cfg=_wider(name))
    assert err.value.code is ErrorCode.INVALID_ARGUMENTS and err.value.details == {"field": f"env.{name}"}
    _exec({name: "/home/agent/x"}, privileged=False, cfg=_wider(name))  # the agent's own job: its business


@pytest.mark.parametrize(
    "value", [":/home/agent/zone", "/home/agent/zone", "/usr/share/zoneinfo/../../../home/agent/z", "../x", "a\tb"]
)
def test_a_root_jobs_tz_is_checked_like_sudo(value: str) -> None:
    with pytest.raises(AirlockError) as err:
        _exec({"TZ": value}, privileged=True, cfg=_wider("TZ"))
    assert err.value.details == {"field": "env.TZ"}


@pytest.mark.parametrize("value", ["UTC", "Europe/Berlin", ":Europe/Berlin", "/usr/share/zoneinfo/UTC", "CET-1CEST"])
def test_a_root_job_takes_a_time_zone(value: str) -> None:
    _exec({"TZ": value}, privileged=True, cfg=_wider("TZ"))


@pytest.mark.parametrize(("name", "value"), [("LANG", "/home/agent/locale"), ("LC_ALL", "x%n"), ("TERM", "../t")])
def test_locale_and_terminal_names_may_not_hold_a_path_for_a_root_job(name: str, value: str) -> None:
    with pytest.raises(AirlockError) as err:
        _exec({name: value}, privileged=True, cfg=_wider("LANG", "LC_*", "TERM"))
    assert err.value.details == {"field": f"env.{name}"}
    _exec(
        {name: "C.UTF-8" if name != "TERM" else "xterm-256color"}, privileged=True, cfg=_wider("LANG", "LC_*", "TERM")
    )
