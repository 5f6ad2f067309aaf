"""approval/hook.py: the notify command — its environment, its input, its deadline, its log events.

Real processes (a shell script in a temporary directory); structlog's capture
shows the events the approval service would log.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from airlock.approval import hook
from airlock.common.resolve import ROOT_PATH

REQUEST = {"request_id": "r-42", "argv": [["apt-get", "update"]], "reason": "refresh ü", "event": "pending"}


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "hook.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def notify(
    argv: tuple[str, ...], *, timeout: float = 10, requests: int = 1, settle: float = 10
) -> list[dict[str, Any]]:
    """Start the hook for ``requests`` pending requests, wait until each has logged its end; the events."""

    async def body() -> None:
        notifier = hook.NotifyCommand(argv, timeout, "/run/airlock/operator.sock")
        for i in range(requests):
            notifier.pending(REQUEST | {"request_id": f"r-{i}"})
        deadline = time.monotonic() + settle
        while notifier._tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await notifier.close()

    with capture_logs() as events:
        asyncio.run(body())
    return [dict(e) for e in events]


def test_the_hook_gets_the_request_on_stdin_and_a_rebuilt_environment(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    argv = (script(tmp_path, f"cat > {out}.json; env | sort > {out}.env; pwd > {out}.pwd; echo hook-ran\n"),)
    events = notify(argv)
    sent = json.loads((tmp_path / "seen.json").read_text())
    assert sent == REQUEST | {"request_id": "r-0"}
    env = dict(line.split("=", 1) for line in (tmp_path / "seen.env").read_text().splitlines())
    env.pop("PWD", None)  # the shell's own
    env.pop("SHLVL", None)
    env.pop("_", None)
    assert env == {
        "PATH": ROOT_PATH,
        "LANG": "C.UTF-8",
        "AIRLOCK_REQUEST_ID": "r-0",
        "AIRLOCK_OPERATOR_SOCKET": "/run/airlock/operator.sock",
    }
    assert (tmp_path / "seen.pwd").read_text() == "/\n"
    [finished] = [e for e in events if e["event"] == "approval.notify.finished"]
    assert finished["request_id"] == "r-0" and finished["exit_code"] == 0 and finished["exit"] == "exit status 0"
    assert finished["stdout"] == "hook-ran\n"


def test_a_failing_hook_is_logged_with_its_output(tmp_path: Path) -> None:
    events = notify((script(tmp_path, "echo broken >&2; exit 3\n"),))
    [failed] = [e for e in events if e["event"] == "approval.notify.failed"]
    assert (failed["exit_code"], failed["exit"], failed["stderr"]) == (3, "exit status 3", "broken\n")
    assert failed["log_level"] == "warning"


def test_a_missing_hook_is_logged_and_forgotten(tmp_path: Path) -> None:
    events = notify((str(tmp_path / "absent"),))
    [failed] = [e for e in events if e["event"] == "approval.notify.failed"]
    assert "No such file" in failed["error"] and failed["command"].endswith("absent")


def test_a_hanging_hook_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    started = time.monotonic()
    events = notify((script(tmp_path, "echo about to hang >&2\nsleep 60\n"),), timeout=0.5)
    assert time.monotonic() - started < 8
    [late] = [e for e in events if e["event"] == "approval.notify.timed_out"]
    assert late["timeout_seconds"] == 0.5 and late["exit"] == "killed by SIGTERM"


def test_a_flood_of_pending_requests_starts_at_most_max_running_hooks(tmp_path: Path) -> None:
    events = notify((script(tmp_path, "sleep 1\n"),), requests=hook.MAX_RUNNING + 3)
    assert sum(e["event"] == "approval.notify.skipped" for e in events) == 3
    assert sum(e["event"] == "approval.notify.finished" for e in events) == hook.MAX_RUNNING


def test_no_command_configured_runs_nothing() -> None:
    assert notify(()) == []


def test_close_stops_running_hooks(tmp_path: Path) -> None:
    marker = tmp_path / "pid"

    async def body() -> None:
        notifier = hook.NotifyCommand((script(tmp_path, f"echo $$ > {marker}; exec sleep 60\n"),), 60, "/x")
        notifier.pending(REQUEST)
        deadline = time.monotonic() + 10
        while not marker.exists() or not marker.read_text().strip():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await notifier.close()
        assert not notifier._tasks

    started = time.monotonic()
    asyncio.run(body())
    assert time.monotonic() - started < 5
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
