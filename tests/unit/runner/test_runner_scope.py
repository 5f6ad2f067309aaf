"""Scope containment: the pure parts (the D-Bus calls run in the system tests)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.sandbox import cpu_quota_property, memory_property
from airlock.runner import units
from airlock.runner.containment import _scope_containment
from airlock.runner.scope import (
    Scope,
    ScopeSettings,
    kill_unit_args,
    start_transient_unit_args,
)
from airlock.runner.spawn import systemd_is_running

from runner_testlib import make_spec, run


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1024", ("MemoryMax", "t", 1024)),
        ("512M", ("MemoryMax", "t", 512 * 1024**2)),
        ("2G", ("MemoryMax", "t", 2 * 1024**3)),
        ("1.5k", ("MemoryMax", "t", 1536)),
        ("infinity", ("MemoryMax", "t", 2**64 - 1)),
        ("50%", ("MemoryMaxScale", "u", round(0.5 * (2**32 - 1)))),
    ],
)
def test_memory_property(value: str, expected: tuple[str, str, int]) -> None:
    assert memory_property(value) == expected


@pytest.mark.parametrize("value", ["", "lots", "2X", "0", "150%", "-1G"])
def test_memory_property_refuses(value: str) -> None:
    with pytest.raises(AirlockError) as caught:
        memory_property(value)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
    assert "runner.memory_max" in caught.value.message


def test_cpu_quota() -> None:
    assert cpu_quota_property("200%") == ("CPUQuotaPerSecUSec", "t", 2_000_000)
    assert cpu_quota_property("12.5%") == ("CPUQuotaPerSecUSec", "t", 125_000)
    for bad in ("200", "0%", "x%", "nan%"):
        with pytest.raises(AirlockError):
            cpu_quota_property(bad)


def test_start_transient_unit_args() -> None:
    settings = ScopeSettings(
        slice="airlock-jobs.slice",
        description="airlock job op-1",
        stop_timeout_seconds=1.5,
        memory_max="1G",
        tasks_max=64,
        cpu_quota="50%",
        runtime_max_seconds=312.5,
    )
    assert start_transient_unit_args("airlock-job-op-1.scope", [101, 102], settings) == [
        "--system", "--quiet", "call",
        "org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
        "StartTransientUnit", "ssa(sv)a(sa(sv))",
        "airlock-job-op-1.scope", "fail", "10",
        "Description", "s", "airlock job op-1",
        "Slice", "s", "airlock-jobs.slice",
        "PIDs", "au", "2", "101", "102",
        "TimeoutStopUSec", "t", "1500000",
        "SendSIGKILL", "b", "true",
        "CollectMode", "s", "inactive-or-failed",
        "RuntimeMaxUSec", "t", "312500000",
        "MemoryMax", "t", str(1024**3),
        "TasksMax", "t", "64",
        "CPUQuotaPerSecUSec", "t", "500000",
        "0",
    ]  # fmt: skip


def test_start_transient_unit_args_without_limits() -> None:
    settings = ScopeSettings(slice="s.slice", description="d", stop_timeout_seconds=0)
    args = start_transient_unit_args("u.scope", [7], settings)
    assert args[8:11] == ["u.scope", "fail", "6"]
    assert not {"MemoryMax", "TasksMax", "CPUQuotaPerSecUSec", "RuntimeMaxUSec"} & set(args)
    assert args[-1] == "0"


def test_kill_unit_args() -> None:
    assert kill_unit_args("u.scope", 15)[-5:] == ["KillUnit", "ssi", "u.scope", "all", "15"]


def test_scope_without_systemd_fails_closed() -> None:
    if systemd_is_running():
        pytest.skip("systemd is running here; the system tests cover real scopes")
    with pytest.raises(AirlockError) as caught:
        run(make_spec(("true",), containment="scope"))
    assert caught.value.code is ErrorCode.SPAWN_FAILED
    assert "systemd" in caught.value.message


def test_scope_containment_checks_limits_when_built() -> None:
    containment = _scope_containment(make_spec(("true",), operation_id="op 1", tasks_max=5))
    # Named like a job's service units (one scheme), with the scope's suffix.
    assert containment.unit == units.unit_name("op 1", None, None, suffix=".scope") == "airlock-job-op_201.u.scope"
    assert containment.gated
    with pytest.raises(AirlockError) as caught:
        _scope_containment(make_spec(("true",), cpu_quota="fast"))
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS


def test_scope_containment_falls_back_to_the_cgroup_when_busctl_fails(tmp_path: Path) -> None:
    """Signalling without a reachable systemd: the scope's own cgroup files are used."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 0\n")
        (tmp_path / "cgroup.kill").write_text("")
        containment = _scope_containment(make_spec(("true",)))
        containment.created = Scope(unit=containment.unit or "", cgroup_dir=str(tmp_path))
        assert asyncio.run(containment.occupied())
        containment.signal_now(signal.SIGKILL)  # a real cgroup.kill kills everything at once
        assert (tmp_path / "cgroup.kill").read_text() == "1"
        if systemd_is_running():
            return  # KillUnit would be asked about a unit that does not exist
        asyncio.run(containment.signal(signal.SIGTERM))  # busctl fails here: walks cgroup.procs
        assert sleeper.wait(timeout=5) == -signal.SIGTERM
        (tmp_path / "cgroup.events").write_text("populated 0\nfrozen 0\n")
        assert not asyncio.run(containment.occupied())
    finally:
        sleeper.kill()
        sleeper.wait()
