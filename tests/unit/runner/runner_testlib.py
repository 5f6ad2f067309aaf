"""Helpers shared by the runner engine tests (not fixtures: those are in conftest.py)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, replace
from typing import Any

import pytest

from airlock.common.containment import Containment
from airlock.runner.identity import Identity, build_env, resolve_identity
from airlock.runner.spawn import JobResult, JobSpec, run_job


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs a job as another user or creates users")


def me() -> Identity:
    return resolve_identity(os.geteuid())


def make_spec(*stages: tuple[str, ...], **overrides: Any) -> JobSpec:
    identity = overrides.pop("identity", me())
    protected = overrides.pop("protected_env", {})
    env = overrides.pop("env", None) or build_env(identity, overrides.pop("request_env", {}), protected)
    spec = JobSpec(
        operation_id="test-op",
        mode="exec",
        stages=tuple(stages),
        identity=identity,
        env=env,
        cwd="/",
        stdin=None,
        timeout_seconds=20.0,
        deadline=None,
        max_output_bytes=1 << 20,
        kill_grace_seconds=0.5,
        protected_values=tuple(protected.values()),
        containment=Containment.PROCESS_GROUP,
    )
    return replace(spec, **overrides)


def run(spec: JobSpec, **kwargs: Any) -> JobResult:
    return asyncio.run(run_job(spec, **kwargs))


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass(frozen=True, slots=True)
class ScratchUser:
    identity: Identity
    supplementary_gid: int
    supplementary_group: str
