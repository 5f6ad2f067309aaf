"""The fork server (runner/forkserver.py) on its own, without systemd: a stage
forked at its gate runs only once the gate opens, with the stdio, argv,
environment and working directory it was given, and its exit status comes back.
And which jobs get a scope from it in service containment (containment.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.common import sandbox
from airlock.common.containment import Containment
from airlock.runner import forker
from airlock.runner.containment import ServiceContainment

from runner_testlib import make_spec


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[[], Awaitable[forker.ForkServer]]]:
    procs: list[subprocess.Popen[bytes]] = []

    async def start(name: str, fd: int) -> None:
        procs.append(subprocess.Popen([sys.executable, "-I", "-S", forker.script_path()], stdin=fd))  # noqa: ASYNC220

    async def connect() -> forker.ForkServer:
        forker._server = None
        return await forker.server(start)

    yield connect
    forker._server = None
    for proc in procs:
        proc.wait(timeout=10)  # it exits once our end closes


def _request(argv: list[str], cwd: str, env: dict[str, str]) -> forker.Spawn:
    return forker.Spawn(
        argv=tuple(argv), env=env, uid=os.getuid(), gid=os.getgid(), groups=tuple(os.getgroups()), cwd=cwd, umask=0o022
    )


async def _run(
    server: Callable[[], Awaitable[forker.ForkServer]], argv: list[str], cwd: str, *, open_gate: bool
) -> tuple[int, bytes, bytes]:
    srv = await server()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    exe = os.open(argv[0], os.O_PATH | os.O_CLOEXEC)
    held = os.open(cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        child = await srv.spawn(_request(argv, cwd, {"GREETING": "hello"}), None, out_w, err_w, exe, [], held)
    finally:
        os.close(out_w)
        os.close(err_w)
        os.close(exe)
        os.close(held)
    if open_gate:
        os.write(child.gate, b"1")
    os.close(child.gate)
    status = await asyncio.wait_for(child.exited, 10)
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        data = (out.read(), err.read())
    srv.sock.close()
    return os.waitstatus_to_exitcode(status), *data


def test_an_opened_gate_runs_the_stage_with_what_it_was_given(
    server: Callable[[], Awaitable[forker.ForkServer]], tmp_path: Path
) -> None:
    code, out, err = asyncio.run(
        _run(server, ["/bin/sh", "-c", 'echo "$GREETING from $(pwd)"; exit 3'], str(tmp_path), open_gate=True)
    )
    assert (code, out, err) == (3, f"hello from {tmp_path}\n".encode(), b"")


def test_a_gate_closed_unopened_runs_nothing(
    server: Callable[[], Awaitable[forker.ForkServer]], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    code, out, _err = asyncio.run(_run(server, ["/usr/bin/touch", str(marker)], str(tmp_path), open_gate=False))
    assert code == 125 and out == b""
    assert not marker.exists()


# --- which stages get a scope (containment.py) ---------------------------------------------


def _containment(**overrides: Any) -> ServiceContainment:
    return ServiceContainment(make_spec(("/usr/bin/true",), containment=Containment.SERVICE, **overrides))


def test_a_job_without_sandbox_or_credentials_gets_scopes() -> None:
    chosen = _containment()
    assert chosen.scoped and chosen.unit_names(make_spec(("/usr/bin/true",)))[0].endswith(".scope")


def test_resource_limits_alone_still_get_a_scope_which_carries_them() -> None:
    limits = sandbox.Sandbox.of({"memory_max": "64M", "tasks_max": 8, "cpu_quota": "50%"})
    chosen = _containment(sandboxes=(limits,))
    assert chosen.scoped
    assert {name for name, _sig, _value in chosen.stage_limits[0]} == {"MemoryMax", "TasksMax", "CPUQuotaPerSecUSec"}


def test_a_service_only_sandbox_property_or_credentials_get_a_service() -> None:
    for settings in ({"read_only": True}, {"private_network": True}, {"no_new_privileges": True}):
        assert not _containment(sandboxes=(sandbox.Sandbox.of(settings),)).scoped, settings
    assert not _containment(credentials=((("token", b"x"),),)).scoped


def _session_keyring(server: Callable[[], Awaitable[forker.ForkServer]], tmp_path: Path) -> bytes:
    code = "import ctypes; print(ctypes.CDLL(None).syscall(250, 0, -3, 0))"  # KEYCTL_GET_KEYRING_ID, session
    exit_code, out, err = asyncio.run(
        _run(server, [sys.executable, "-I", "-S", "-c", code], str(tmp_path), open_gate=True)
    )
    assert exit_code == 0, err
    return out


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe calls keyctl by its x86_64 number")
def test_each_stage_has_a_session_keyring_of_its_own(
    server: Callable[[], Awaitable[forker.ForkServer]], tmp_path: Path
) -> None:
    # As with a service per job (KeyringMode=private): keys one job keeps are not in another's session keyring.
    first, second = _session_keyring(server, tmp_path), _session_keyring(server, tmp_path)
    assert first.strip().isdigit() and first != second


def test_a_fork_server_that_died_is_started_again_for_the_next_job(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []

    async def start(name: str, fd: int) -> None:
        procs.append(subprocess.Popen([sys.executable, "-I", "-S", forker.script_path()], stdin=fd))  # noqa: ASYNC220

    async def scenario() -> tuple[int, int, bytes]:
        forker._server = None
        first = await forker.server(start)
        assert await forker.server(start) is first  # one fork server while it lives
        procs[0].kill()
        procs[0].wait()
        while not first.closed:  # the runner's end sees the fork server go
            await asyncio.sleep(0.01)
        second = await forker.server(start)
        out_r, out_w = os.pipe()
        exe = os.open("/bin/echo", os.O_PATH | os.O_CLOEXEC)
        held = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            request = _request(["/bin/echo", "again"], str(tmp_path), {})
            child = await second.spawn(request, None, out_w, out_w, exe, [], held)
        finally:
            os.close(out_w)
            os.close(exe)
            os.close(held)
        os.write(child.gate, b"1")
        os.close(child.gate)
        status = await asyncio.wait_for(child.exited, 10)
        with os.fdopen(out_r, "rb") as out:
            data = out.read()
        second.sock.close()
        forker._server = None
        return len(procs), os.waitstatus_to_exitcode(status), data

    try:
        assert asyncio.run(scenario()) == (2, 0, b"again\n")
    finally:
        for proc in procs:
            proc.wait(timeout=10)
