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
