"""The fork server (runner/forkserver.py) executes the file the runner opened and
checked, held by fd: a binary swapped at its path after the check, while the
stage waits at its gate, is not what runs.  The control: without the swap, the
same stage runs the same file."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

from airlock.runner import forker


async def _run_held(path: Path, swap_to: Path | None) -> bytes:
    procs: list[subprocess.Popen[bytes]] = []

    async def start(name: str, fd: int) -> None:
        procs.append(subprocess.Popen([sys.executable, "-I", "-S", forker.script_path()], stdin=fd))  # noqa: ASYNC220

    forker._server = None
    srv = await forker.server(start)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    held = os.open(path, os.O_PATH | os.O_CLOEXEC)  # what the runner opened and checked
    request = forker.Spawn(
        argv=(str(path),),
        env={},
        uid=os.getuid(),
        gid=os.getgid(),
        groups=tuple(os.getgroups()),
        cwd="/",
        umask=0o022,
    )
    cwd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the working directory, held as well
    try:
        child = await srv.spawn(request, None, out_w, err_w, held, [], cwd)
    finally:
        os.close(out_w)
        os.close(err_w)
        os.close(held)
        os.close(cwd)
    if swap_to is not None:  # the attack: another file at the approved path, before the stage executes
        os.replace(swap_to, path)
    os.write(child.gate, b"1")
    os.close(child.gate)
    await asyncio.wait_for(child.exited, 10)
    with os.fdopen(out_r, "rb") as out:
        data = out.read()
    os.close(err_r)
    srv.sock.close()
    forker._server = None
    for proc in procs:
        proc.wait(timeout=10)
    return data


def _script(path: Path, word: str) -> None:
    path.write_text(f"#!/bin/sh\necho {word}\n")
    path.chmod(0o755)


def test_a_binary_swapped_while_the_stage_waits_is_not_what_runs(tmp_path: Path) -> None:
    approved = tmp_path / "tool"
    _script(approved, "approved")
    assert asyncio.run(_run_held(approved, None)) == b"approved\n"  # the control
    _script(approved, "approved")
    evil = tmp_path / "evil"
    _script(evil, "swapped")
    assert asyncio.run(_run_held(approved, evil)) == b"approved\n"
    assert approved.read_text().endswith("swapped\n")  # the path did change: the held file ran
    shutil.rmtree(tmp_path, ignore_errors=True)
