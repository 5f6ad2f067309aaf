"""Service containment's pure parts (runner/units.py) and its exec helper.

What talks to systemd is exercised by the system tests (tests/system/test_9_units.py);
the helper runs here for real, as systemd would run it in a job's unit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airlock.common import sandbox
from airlock.common.errors import AirlockError
from airlock.runner import units
from airlock.runner.binaries import _Binary
from airlock.runner.stageunit import for_stage

from runner_testlib import make_spec


def _helper(
    path: str,
    st: os.stat_result,
    *argv: str,
    env: dict[str, str] | None = None,
    privileged: bool = False,
    extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    unit = units.StageUnit(
        name="x.service",
        description="d",
        slice="s.slice",
        python=os.path.realpath(sys.executable),
        path=path,
        dev=st.st_dev,
        ino=st.st_ino,
        owner=st.st_uid if privileged else None,
        mode=stat.S_IMODE(st.st_mode) if privileged else None,
        argv=(path, *argv),
        uid=0,
        gid=0,
        groups=(),
        cwd="/",
        cwd_id=None,
        umask=0o022,
        env_file="/run/x.env",
        stop_timeout_seconds=1,
        runtime_max_seconds=10,
    )
    # What systemd does: load the EnvironmentFile, exec ExecStart's argv.
    text = units.env_file_text(env or {}).decode()
    name, value = text.strip().split("=", 1)
    return subprocess.run(
        units.helper_argv(unit), env={name: value, "LC_ALL": "C", **(extra or {})}, capture_output=True, check=False
    )


def test_helper_runs_the_checked_file_with_exactly_the_job_environment() -> None:
    path = os.path.realpath(shutil.which("env") or "/usr/bin/env")
    st = os.stat(path)
    tricky = "a b\nc'\"$`\\ é"
    r = _helper(path, st, env={"PATH": "/usr/bin", "TRICKY": tricky}, privileged=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == f"PATH=/usr/bin\nTRICKY={tricky}\n"


def test_helper_passes_systemds_credentials_directory_and_nothing_else_of_its_own() -> None:
    path = os.path.realpath(shutil.which("env") or "/usr/bin/env")
    st = os.stat(path)
    r = _helper(path, st, env={"PATH": "/usr/bin"}, extra={"CREDENTIALS_DIRECTORY": "/run/credentials/x.service"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == ["PATH=/usr/bin", "CREDENTIALS_DIRECTORY=/run/credentials/x.service"]


def test_helper_refuses_a_file_swapped_after_the_runners_check(tmp_path: Path) -> None:
    # The runner checked one file; by the time the unit starts, another sits at the path.
    path = tmp_path / "tool"
    marker = tmp_path / "ran"
    path.write_text(f"#!/bin/sh\ntouch {marker}\n")
    path.chmod(0o755)
    checked = os.stat(path)
    control = _helper(str(path), checked)
    assert control.returncode == 0 and marker.exists(), control.stderr  # the control: the checked file runs
    marker.unlink()
    swapped = tmp_path / "tool.new"
    swapped.write_text(f"#!/bin/sh\ntouch {marker}\n")
    swapped.chmod(0o755)
    os.rename(swapped, path)
    r = _helper(str(path), checked)
    assert r.returncode == units.HELPER_EXIT_CHANGED
    assert b"is not the file the runner checked" in r.stderr
    assert not marker.exists()


def test_helper_refuses_a_symlink_on_the_way(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    target = real / "true"
    shutil.copy(os.path.realpath(shutil.which("true") or "/usr/bin/true"), target)
    st = os.stat(target)
    (tmp_path / "link").symlink_to(real)
    r = _helper(str(tmp_path / "link" / "true"), st)
    assert r.returncode == units.HELPER_EXIT_CHANGED
    assert b"without following a symlink" in r.stderr
    assert _helper(str(target), st).returncode == 0  # the control


def test_helper_refuses_a_changed_mode_for_root_jobs(tmp_path: Path) -> None:
    path = tmp_path / "tool"
    shutil.copy(os.path.realpath(shutil.which("true") or "/usr/bin/true"), path)
    path.chmod(0o755)
    st = os.stat(path)
    assert _helper(str(path), st, privileged=True).returncode == 0
    path.chmod(0o775)
    r = _helper(str(path), st, privileged=True)
    assert r.returncode == units.HELPER_EXIT_CHANGED and b"changed owner or mode" in r.stderr


def test_unit_names_are_distinct_for_distinct_keys() -> None:
    ids = ["a", "a_", "a_5f", "a/b", "a_2fb", "a.u1", "a.u1.s0", "é", "_c3_a9", "x" * 300, "x" * 301, ""]
    keys = list(itertools.product(ids, [None, 0, 1, 10], [None, 0, 1]))
    names = [units.unit_name(op, uid, stage) for op, uid, stage in keys]
    assert len(set(names)) == len(keys)
    for name in names:
        assert len(name) <= 255 and name.startswith("airlock-job-") and name.endswith(".service")
        assert all(c.isascii() and (c.isalnum() or c in "._-:") for c in name), name
    assert units.unit_name("deploy-1", 1000, None) == "airlock-job-deploy-1.u1000.service"


def test_unit_properties_carry_identity_and_never_the_environment() -> None:
    unit = units.StageUnit(
        name="airlock-job-x.u5.service",
        description="airlock job x",
        slice="airlock-jobs.slice",
        python="/usr/bin/python3.11",
        path="/usr/bin/id",
        dev=1,
        ino=2,
        owner=None,
        mode=None,
        argv=("/usr/bin/id", "-u"),
        uid=1000,
        gid=1000,
        groups=(1000, 27),
        cwd="/home/u",
        cwd_id=(3, 4),
        umask=0o022,
        env_file="/run/airlock-runner/airlock-job-x.u5.service.env",
        stop_timeout_seconds=2,
        runtime_max_seconds=30,
        limits=(("PrivateNetwork", "b", True),),
    )
    props = {name: value for name, _sig, value in units.unit_properties(unit)}
    assert props["User"] == "1000" and props["Group"] == "1000" and props["SupplementaryGroups"] == ["27"]
    assert props["WorkingDirectory"] == "/home/u" and props["Slice"] == "airlock-jobs.slice"
    assert props["EnvironmentFiles"] == [(unit.env_file, False)]
    assert "Environment" not in props  # world-readable through systemctl show
    assert props["RuntimeMaxUSec"] == 30_000_000 and props["TimeoutStopUSec"] == 2_000_000
    assert props["KillMode"] == "control-group" and props["AddRef"] is True
    assert props["PrivateNetwork"] is True
    ((python, argv, _ignore),) = props["ExecStart"]
    assert python == "/usr/bin/python3.11" and argv[-2:] == ["/usr/bin/id", "-u"]
    assert argv[-3] == "3:4"  # the held working directory, which the helper compares with where systemd put it
    root = units.unit_properties(units.StageUnit(**{**{f: getattr(unit, f) for f in unit.__slots__}, "uid": 0}))
    assert "User" not in {name for name, _s, _v in root}  # a root job: systemd's own default


def test_returncode_from_exec_main_code() -> None:
    assert units.returncode_of(1, 3) == 3
    assert units.returncode_of(2, 15) == -15
    assert units.returncode_of(3, 11) == -11


def test_sandbox_properties() -> None:
    props = sandbox.properties(
        {
            "read_only": True,
            "read_write_paths": ["/var/lib/app"],
            "private_network": True,
            "private_tmp": True,
            "memory_max": "512M",
            "cpu_quota": "50%",
            "tasks_max": 64,
            "capabilities": ["CAP_NET_ADMIN", "CAP_CHOWN"],
            "no_new_privileges": True,
        }
    )
    got = {name: value for name, _sig, value in props}
    assert got == {
        "ProtectSystem": "strict",
        "ReadWritePaths": ["/var/lib/app"],
        "PrivateNetwork": True,
        "PrivateTmp": True,
        "MemoryMax": 512 * 1024**2,
        "CPUQuotaPerSecUSec": 500_000,
        "TasksMax": 64,
        "CapabilityBoundingSet": (1 << 12) | 1,
        "NoNewPrivileges": True,
    }
    assert sandbox.properties({}) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"readonly": True}, "sandbox.readonly: unknown key"),
        ({"read_only": "yes"}, "sandbox.read_only: expected true or false"),
        ({"read_write_paths": ["relative"]}, "sandbox.read_write_paths: expected an absolute path"),
        ({"read_write_paths": ["/a/../etc"]}, "sandbox.read_write_paths: expected an absolute path"),
        ({"memory_max": "lots"}, "sandbox.memory_max: expected bytes"),
        ({"tasks_max": 0}, "sandbox.tasks_max: expected a positive number"),
        ({"capabilities": ["CAP_EVERYTHING"]}, "sandbox.capabilities: expected a list of capability names"),
    ],
)
def test_sandbox_errors_name_the_key(value: dict[str, object], message: str) -> None:
    with pytest.raises(AirlockError) as err:
        sandbox.properties(value)
    assert err.value.message.startswith(message)


def test_bound_sandbox_is_one_valid_entry_per_stage() -> None:
    assert sandbox.parse_bound(None, 2) is None
    parsed = sandbox.parse_bound([{}, {"read_only": True}], 2)
    assert parsed is not None and [dict(sb.settings) for sb in parsed] == [{}, {"read_only": True}]
    assert not parsed[0] and parsed[1].properties == (("ProtectSystem", "s", "strict"),)  # computed once, here
    with pytest.raises(AirlockError):
        sandbox.parse_bound([{"read_only": True}], 2)
    with pytest.raises(AirlockError):
        sandbox.parse_bound([{}, {"private_network": 1}], 2)


def _helper_with_scripts(tmp_path: Path, script: bytes, digest: str) -> subprocess.CompletedProcess[bytes]:
    """The helper as systemd runs it for a root job whose argv[1] is a reviewed script (issue 27)."""
    path = os.path.realpath("/bin/sh")
    st = os.stat(path)
    copy = tmp_path / "x.service.script1"
    copy.write_bytes(script)
    unit = units.StageUnit(
        name="x.service",
        description="d",
        slice="s.slice",
        python=os.path.realpath(sys.executable),
        path=path,
        dev=st.st_dev,
        ino=st.st_ino,
        owner=st.st_uid,
        mode=stat.S_IMODE(st.st_mode),
        argv=(path, "/home/agent/task.sh"),
        uid=0,
        gid=0,
        groups=(),
        cwd="/",
        cwd_id=None,
        umask=0o022,
        env_file="/run/x.env",
        stop_timeout_seconds=1,
        runtime_max_seconds=10,
    )
    text = units.env_file_text({"PATH": "/usr/bin"}, [units.ScriptCopy(1, digest, str(copy))]).decode()
    env = dict(line.split("=", 1) for line in text.splitlines())
    return subprocess.run(units.helper_argv(unit), env=env | {"LC_ALL": "C"}, capture_output=True, check=False)


def test_helper_runs_a_reviewed_script_from_a_sealed_memfd(tmp_path: Path) -> None:
    script = b'echo "$0"; printf x >> "$0" 2>/dev/null || echo sealed\n'
    r = _helper_with_scripts(tmp_path, script, hashlib.sha256(script).hexdigest())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("/proc/self/fd/") and lines[1] == "sealed"  # not the path; not writable


def test_helper_refuses_a_script_copy_that_is_not_the_reviewed_one(tmp_path: Path) -> None:
    r = _helper_with_scripts(tmp_path, b"echo other\n", hashlib.sha256(b"echo reviewed\n").hexdigest())
    assert r.returncode == units.HELPER_EXIT_CHANGED and b"not the reviewed script" in r.stderr
    assert b"other" not in r.stdout


# --- waiting for a unit and releasing it (systemd's side faked: its answers, not its timing) ---


@dataclasses.dataclass(frozen=True)
class _Answer:
    """What `units._state` answers about a unit (systemd's side of the conversation)."""

    active: str
    job: int = 0
    code: int = 0
    status: int = 0
    cgroup: str = ""
    cpu_nsec: int | None = None
    main_pid: int = 0

    @property
    def final(self) -> bool:
        return self.active in ("inactive", "failed") and self.job == 0


def _exits_after(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", f"import time; time.sleep({seconds})"])


def test_wait_reads_the_unit_when_its_main_process_exits_not_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's end is noticed by its main process's pidfd: a few reads of the unit, however long it ran."""
    child = _exits_after(0.4)
    reads: list[str] = []

    def state(name: str) -> _Answer:
        reads.append(name)
        if child.poll() is None:
            return _Answer("active", main_pid=child.pid)
        return _Answer("inactive", code=1, status=3, cpu_nsec=1234)

    monkeypatch.setattr(units, "_state", lambda name, *_: state(name))
    monkeypatch.setattr(units, "_main_pid", lambda name: child.pid if child.poll() is None else 0, raising=False)
    service = units.StageService("airlock-job-x.u0.service")
    started = time.monotonic()
    assert asyncio.run(service.wait()) == 3
    assert child.returncode == 0 and time.monotonic() - started < 2
    assert service.cpu_nsec == 1234
    assert len(reads) <= 3, reads  # polling with backoff read it about a dozen times in 0.4 s


def test_wait_without_a_main_process_to_hold_still_finds_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit that never gets a main process (systemd could not fork it) ends by its state alone."""
    answers = iter([_Answer("inactive", job=7), _Answer("activating", job=7), _Answer("failed")])
    monkeypatch.setattr(units, "_state", lambda name, *_: next(answers))
    service = units.StageService("airlock-job-x.u0.service")
    assert asyncio.run(service.wait()) == 127  # never forked
    assert service.failed


def test_release_drops_a_stopped_unit_with_one_call_and_stops_a_running_one(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(units, "_call", lambda *args: calls.append(args))
    monkeypatch.setattr(units, "_exists", lambda name: False)
    stopped = units.StageService("a.service")
    stopped.returncode = 0
    asyncio.run(stopped.release())
    assert calls == [("UnrefUnit", "a.service")]
    stopped.release_soon()  # abandoning the job afterwards sends nothing more
    units._executor.submit(lambda: None).result()
    assert calls == [("UnrefUnit", "a.service")]
    calls.clear()
    running = units.StageService("b.service")
    running.release_soon()
    units._executor.submit(lambda: None).result()
    assert calls == [("StopUnit", "b.service", "replace"), ("ResetFailedUnit", "b.service"), ("UnrefUnit", "b.service")]


def test_unit_object_path_is_systemds_escaping_of_the_name() -> None:
    """What systemd's GetUnit answers for these names (bus_label_escape): the path is read without asking."""
    assert units._unit_path("systemd-journald.service") == "/org/freedesktop/systemd1/unit/systemd_2djournald_2eservice"
    assert (
        units._unit_path("airlock-job-x_2fy.u0.s1.service")
        == "/org/freedesktop/systemd1/unit/airlock_2djob_2dx_5f2fy_2eu0_2es1_2eservice"
    )


def test_a_main_process_is_held_only_if_the_unit_still_names_it_after_the_pidfd_is_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PID the unit no longer names (reaped, maybe reused) is never waited for: the unit is polled instead."""
    child = _exits_after(5)
    try:
        monkeypatch.setattr(units, "_state", lambda name, *_: _Answer("", main_pid=child.pid))
        monkeypatch.setattr(units, "_main_pid", lambda name: child.pid + 1)
        state, held = units._state_held("a.service", None)
        assert state is not None and state.main_pid == child.pid and held is None
        monkeypatch.setattr(units, "_main_pid", lambda name: child.pid)  # control: still its main process
        state, held = units._state_held("a.service", None)
        assert held is not None
        os.close(held)
    finally:
        child.kill()
        child.wait()


def test_a_stage_unit_carries_the_held_working_directory_to_the_helper(tmp_path: Path) -> None:
    true = os.path.realpath("/usr/bin/true")
    held = os.stat(tmp_path)
    spec = make_spec((true,), cwd=str(tmp_path))
    binary = _Binary(true, -1, os.stat(true))
    unit = for_stage(spec, 0, binary, env_file="/x", limits=(), runtime_max_seconds=1, cwd=held)
    assert unit.cwd == str(tmp_path) and unit.cwd_id == (held.st_dev, held.st_ino)
    assert units.helper_argv(unit)[10] == f"{held.st_dev}:{held.st_ino}"  # after path, dev, ino, owner, mode
