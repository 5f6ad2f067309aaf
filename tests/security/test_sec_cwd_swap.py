"""Attacks on *where a job starts*: the working directory checked is the one entered.

The runner checks a job's cwd (identity.py ``check_cwd``: the user may enter
every directory on the way) and then starts the job there.  An agent that
owns a component of that path can swap it (a rename, a symlink) between the
check and the chdir, so that the job starts in a directory the check never
saw: one the job's user may not enter (a runner chdirs as root, before
setuid), or, for a root job, anywhere.  The runner now walks the cwd once on
fds (``O_PATH | O_NOFOLLOW``, symlinks followed by hand), checks the held
directory's ``fstat`` and enters that fd, one test per start path:

1. process groups (``subprocess.Popen``): live stack, an agent flipping its
   directory with a symlink to one it may not enter while it asks; and the
   same swap staged deterministically between the check and the spawn;
2. the fork server (scope stages): the swap before the stage is forked;
3. a stage's service (systemd's ``WorkingDirectory=`` is a path): the exec
   helper compares where systemd put it with the held directory and refuses.

Without the fix (``cwd=spec.cwd``; ``os.chdir(spec["cwd"])``; no comparison
in the helper) 1 and 2 run the job in the swapped-in directory and 3 runs it.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_exec, as_user, needs_root, red_stack, root_dir, throwaway_user

from airlock.common.containment import Containment
from airlock.runner import binaries, forker, spawn, units
from airlock.runner.identity import build_env, open_cwd, resolve_identity
from airlock.runner.jobspec import JobSpec

from support import Stack

pytestmark = needs_root

PWD = os.path.realpath("/usr/bin/pwd")
_RENAME_EXCHANGE = 2

# Run as the agent: swap two names in its own directory, atomically, until killed.
_FLIPPER = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = (p.encode() for p in sys.argv[1:3])
print("flipping", flush=True)
while True:
    libc.renameat2(-100, a, -100, b, 2)
"""


def _exchange(a: Path, b: Path) -> None:
    """Swap what two names in one filesystem name, in one step (renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(a))


@pytest.fixture
def places() -> Iterator[tuple[Path, Path, Path]]:
    """(approved, elsewhere, the name that will lead to elsewhere): a directory at ``approved``,
    a root-only one elsewhere, and a symlink to it beside the approved one, ready to be swapped in."""
    top = root_dir()
    approved, elsewhere, link = top / "work", top / "elsewhere", top / "work.new"
    approved.mkdir()
    elsewhere.mkdir(mode=0o700)
    link.symlink_to(elsewhere)
    try:
        yield approved, elsewhere, link
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _spec(cwd: str, containment: Containment = Containment.PROCESS_GROUP) -> JobSpec:
    identity = resolve_identity(0)
    return JobSpec(
        operation_id=f"op-cwd-{uuid.uuid4()}",
        mode="exec",
        stages=((PWD,),),
        identity=identity,
        env=build_env(identity, {}, {}),
        cwd=cwd,
        stdin=None,
        timeout_seconds=20.0,
        deadline=None,
        max_output_bytes=1 << 20,
        kill_grace_seconds=0.5,
        protected_values=(),
        containment=containment,
    )


# --- 1. process groups: Popen --------------------------------------------------------------


def test_process_group_job_enters_the_directory_checked_not_the_one_swapped_in(
    places: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    approved, elsewhere, link = places
    opened = binaries._open_all

    def swap_then_open(spec: JobSpec) -> Any:
        # After check_cwd, before the spawn: the moment an agent would pick.
        _exchange(approved, link)
        return opened(spec)

    monkeypatch.setattr(spawn, "_open_all", swap_then_open)
    result = asyncio.run(spawn.run_job(_spec(str(approved))))
    # The control: the path did change, to a link into the other directory.
    assert os.path.realpath(approved) == str(elsewhere)
    assert result.stages[0].exit_code == 0, result.stages[0].stderr
    assert result.stdout == f"{link}\n".encode()  # the directory checked, under its new name
    assert result.cwd == str(approved)  # the evidence names the bound path


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alcwd") as user:
        yield user


@pytest.fixture(scope="module")
def cstack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    config = f"""
agents:
  users: [root, {agent.pw_name}]
policy:
  default: deny
  rules:
    - name: where-am-i
      decision: allow
      users: [{agent.pw_name}]
      privileged: false
      commands: [[{PWD}]]
"""
    with red_stack(config) as stack:
        yield stack


def test_an_agent_flipping_its_cwd_never_starts_a_job_where_it_may_not_enter(
    cstack: Stack, agent: pwd.struct_passwd
) -> None:
    home = Path(agent.pw_dir)
    top = root_dir()
    secret = top / "secret"
    secret.mkdir(mode=0o700)  # root's: the agent may not enter it
    work, link = home / "work", home / "work.flip"
    try:
        subprocess.run(["mkdir", str(work)], check=True, **as_user(agent))
        subprocess.run(["ln", "-s", str(secret), str(link)], check=True, **as_user(agent))
        # The control: the agent itself cannot go there.
        denied = subprocess.run(["sh", "-c", f"cd {secret}"], capture_output=True, check=False, **as_user(agent))
        assert denied.returncode != 0
        flipper = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-c", _FLIPPER, str(work), str(link)],
            stdout=subprocess.PIPE,
            **as_user(agent),
        )
        assert flipper.stdout is not None and flipper.stdout.readline() == b"flipping\n"
        ran, refused = [], 0
        try:
            for _attempt in range(60):
                reply = agent_exec(cstack.agent, agent, {"argv": [PWD], "privileged": False, "cwd": str(work)})
                if reply["ok"]:
                    ran.append(base64.b64decode(reply["data"]["stdout"]).decode().strip())
                else:
                    assert reply["error"]["code"] == "spawn_failed", reply  # the check saw the link: refused
                    refused += 1
        finally:
            os.kill(flipper.pid, signal.SIGKILL)
            flipper.wait()
        # The control: the race was live, the check saw both the directory and the link.
        assert ran and refused, (ran, refused)
        assert str(secret) not in ran, f"a job of {agent.pw_name} started in {secret}"
        assert set(ran) <= {str(work), str(link)}, ran
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- 2. the fork server: fchdir on the fd it is sent ---------------------------------------


async def _fork_server_pwd(cwd: Path, swap: tuple[Path, Path]) -> tuple[int, bytes, bytes]:
    procs: list[subprocess.Popen[bytes]] = []

    async def start(name: str, fd: int) -> None:
        procs.append(subprocess.Popen([sys.executable, "-I", "-S", forker.script_path()], stdin=fd))  # noqa: ASYNC220

    forker._server = None
    srv = await forker.server(start)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    exe = os.open(PWD, os.O_PATH | os.O_CLOEXEC)
    held = open_cwd(resolve_identity(0), str(cwd))  # what the runner checked
    _exchange(*swap)  # the attack: the path names another directory before the stage is forked
    request = forker.Spawn(argv=(PWD,), env={}, uid=0, gid=0, groups=tuple(os.getgroups()), cwd=str(cwd), umask=0o022)
    try:
        child = await srv.spawn(request, None, out_w, err_w, exe, [], held.fd)
    finally:
        for fd in (out_w, err_w, exe):
            os.close(fd)
        held.close()
    os.write(child.gate, b"1")
    os.close(child.gate)
    status = await asyncio.wait_for(child.exited, 10)
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        data = out.read(), err.read()
    srv.sock.close()
    forker._server = None
    for proc in procs:
        proc.wait(timeout=10)
    return os.waitstatus_to_exitcode(status), *data


def test_fork_server_stage_enters_the_held_directory_not_the_path(places: tuple[Path, Path, Path]) -> None:
    approved, elsewhere, link = places
    code, out, err = asyncio.run(_fork_server_pwd(approved, (approved, link)))
    assert os.path.realpath(approved) == str(elsewhere)  # the control: the path was swapped
    assert (code, out) == (0, f"{link}\n".encode()), err


# --- 3. a stage's service: the exec helper compares where systemd put it -------------------


def _helper_in(directory: Path, held: os.stat_result, mark: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the exec helper as systemd would after chdir(WorkingDirectory=) landed in ``directory``."""
    touch = os.path.realpath("/usr/bin/touch")
    st = os.stat(touch)
    unit = units.StageUnit(
        name="x.service",
        description="d",
        slice="s.slice",
        python=os.path.realpath(sys.executable),
        path=touch,
        dev=st.st_dev,
        ino=st.st_ino,
        owner=None,
        mode=None,
        argv=(touch, str(mark)),
        uid=0,
        gid=0,
        groups=(),
        cwd="/unused",
        cwd_id=(held.st_dev, held.st_ino),
        umask=0o022,
        env_file="/run/x.env",
        stop_timeout_seconds=1,
        runtime_max_seconds=10,
    )
    env = units.env_file_text({"PATH": "/usr/bin"}).decode().strip().split("=", 1)
    return subprocess.run(
        units.helper_argv(unit), cwd=directory, env={env[0]: env[1]}, capture_output=True, check=False
    )


def test_service_stage_in_another_directory_than_the_held_one_is_refused(
    places: tuple[Path, Path, Path], marks: Path
) -> None:
    approved, elsewhere, link = places
    held = open_cwd(resolve_identity(0), str(approved))
    try:
        mark = marks / f"cwd-{uuid.uuid4()}"
        ok = _helper_in(approved, held.st, mark)  # the control: in the directory checked, it runs
        assert ok.returncode == 0 and mark.exists(), ok.stderr
        mark.unlink()
        _exchange(approved, link)  # systemd would now chdir into elsewhere
        refused = _helper_in(elsewhere, held.st, mark)
        assert refused.returncode == units.HELPER_EXIT_CHANGED
        assert b"working directory is not the one the runner checked" in refused.stderr
        assert not mark.exists()  # nothing of the job ran
    finally:
        held.close()
