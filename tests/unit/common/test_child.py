"""common/child.py: the one way airlock starts a helper process, stops it and describes its exit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airlock.common import child
from airlock.common.resolve import ROOT_PATH


def test_the_environment_is_rebuilt_from_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_FDS", "3")
    monkeypatch.setenv("SECRET_OF_THE_PARENT", "x")
    assert child.environment(AIRLOCK_REQUEST_ID="r1") == {
        "PATH": ROOT_PATH,
        "LANG": "C.UTF-8",
        "AIRLOCK_REQUEST_ID": "r1",
    }
    done = asyncio.run(child.run(["/usr/bin/env"], env=child.environment(), timeout=10))
    assert sorted(done.stdout.decode().splitlines()) == ["LANG=C.UTF-8", f"PATH={ROOT_PATH}"]


@pytest.mark.parametrize(
    ("returncode", "described", "text"),
    [
        (0, (0, None), "exit status 0"),
        (3, (3, None), "exit status 3"),
        (127, (127, None), "exit status 127 (command not found)"),
        (126, (126, None), "exit status 126 (not executable)"),
        (-9, (None, 9), "killed by SIGKILL"),
        (-15, (None, 15), "killed by SIGTERM"),
        (-200, (None, 200), "killed by signal 200"),
    ],
)
def test_an_exit_is_described_one_way(returncode: int, described: tuple[int | None, int | None], text: str) -> None:
    assert child.describe_exit(returncode) == described
    assert child.exit_text(returncode) == text


def test_stdin_goes_in_and_output_comes_back() -> None:
    done = asyncio.run(
        child.run(["/bin/sh", "-c", "cat; echo oops >&2; exit 4"], env=child.environment(), stdin=b"hi\n", timeout=10)
    )
    assert (done.stdout, done.stderr, done.exit_code, done.timed_out) == (b"hi\n", b"oops\n", 4, False)
    assert done.text() == "exit status 4"


def test_stdin_is_dev_null_without_bytes() -> None:
    done = asyncio.run(child.run(["/bin/sh", "-c", "cat; pwd"], env=child.environment(), timeout=10))
    assert done.stdout == b"/\n"  # nothing read, and the directory is /


def test_a_deadline_stops_the_whole_process_group(tmp_path: Path) -> None:
    """SIGTERM reaches what the helper started too; one that ignores it gets SIGKILL after the grace."""
    marker = tmp_path / "grandchild.pid"
    script = f"trap '' TERM; sleep 60 & echo $! > {marker}; wait"
    started = time.monotonic()
    done = asyncio.run(child.run(["/bin/sh", "-c", script], env=child.environment(), timeout=1, grace=0.5))
    assert done.timed_out and done.signal == 9 and done.text() == "killed by SIGKILL"
    assert time.monotonic() - started < 10
    grandchild = int(marker.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(grandchild):
        time.sleep(0.05)
    assert not _alive(grandchild), "the helper's own child survived its stop"


def test_a_helper_that_obeys_sigterm_is_not_killed() -> None:
    done = asyncio.run(child.run(["/bin/sleep", "60"], env=child.environment(), timeout=0.5, grace=5))
    assert done.timed_out and done.signal == 15


def test_a_cancelled_run_kills_and_waits(tmp_path: Path) -> None:
    marker = tmp_path / "helper.pid"

    async def body() -> int:
        script = f"echo $$ > {marker}; exec sleep 60"
        task = asyncio.create_task(child.run(["/bin/sh", "-c", script], env=child.environment(), timeout=60))
        deadline = time.monotonic() + 10
        while not marker.exists() or not marker.read_text().strip():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return int(marker.read_text())

    pid = asyncio.run(body())
    assert not _alive(pid)  # killed and waited for (reaped) before the cancellation went on


def test_a_missing_command_raises_oserror() -> None:
    with pytest.raises(FileNotFoundError):
        asyncio.run(child.run(["/nonexistent/helper"], env=child.environment(), timeout=5))


def test_stop_all_terminates_then_kills() -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # its handler is set
    started = time.monotonic()
    child.stop_all([polite, stubborn], grace=1.0)
    assert polite.returncode == -15 and stubborn.returncode == -9
    assert time.monotonic() - started < 10


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie that init has not reaped yet is gone for our purpose
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
