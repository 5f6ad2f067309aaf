"""The journal watches its disk (issue 38): `airlock status` shows it, journald hears of low space before writes fail.

A live stack whose state lives on a small tmpfs (a real filesystem of a
fixed size, mounted for the test as root): filling it with a ballast file
past ``journal.disk_warn_bytes`` brings ``journal.disk.low`` with its
MESSAGE_ID, repeated no more often than ``journal.disk_warn_every_seconds``;
removing the ballast brings ``journal.disk.recovered``.  Control: before the
ballast, no warning and `airlock status` shows the space as fine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.common.kinds import NOTICES

from support import Stack, start_stack, stop_stack
from waits import wait_log_events

MiB = 1024 * 1024

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="mounts a small tmpfs for the journal's state: needs root and mount",
)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "fs"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _log_events(runtime: Path, name: str) -> list[dict[str, Any]]:
    path = runtime / "logs" / "journal.log"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == name:
            out.append(entry)
    return out


def _disk(stack: Stack) -> dict[str, Any]:
    done = stack.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    disk: dict[str, Any] = json.loads(done.stdout)["data"]["services"]["journal"]["disk"]
    return disk


def test_low_space_is_warned_about_then_cleared(small_fs: Path) -> None:
    runtime = small_fs / "rt"
    config = small_fs / "cfg.yaml"
    config.write_text(
        "journal:\n"
        f"  disk_warn_bytes: {16 * MiB}\n"
        "  disk_warn_percent: 0\n"
        "  disk_check_seconds: 0.2\n"
        "  disk_warn_every_seconds: 1\n",
        encoding="utf-8",
    )
    s = start_stack(runtime, config)
    try:
        assert s.exec({"argv": ["true"], "privileged": False})["ok"] is True
        disk = _disk(s)  # control: plenty of room, nothing said
        assert disk["low"] is False and 16 * MiB < disk["free_bytes"] <= 32 * MiB, disk
        assert disk["filesystem_bytes"] == 32 * MiB and disk["journal_bytes"] > 0, disk
        assert disk["segment"] == str(runtime / "state" / "journal.sqlite"), disk
        assert _log_events(runtime, "journal.disk.low") == []
        text = s.cli("status").stdout
        assert "free" in text and "LOW" not in text, text

        ballast = small_fs / "ballast"
        ballast.write_bytes(b"\1" * (disk["free_bytes"] - 10 * MiB))  # 10 MiB left: under 16
        first, second = wait_log_events(runtime / "logs", "journal.disk.low", 2)[:2]
        assert first["message_id"] == NOTICES["journal.disk.low"] and first["free_bytes"] < 16 * MiB, first
        assert first["warn_bytes"] == 16 * MiB and first["database"].endswith("journal.sqlite"), first
        # Repeated while low, but not at every check (0.2 s): at most once a second.
        gap = _ts(second) - _ts(first)
        assert gap >= 0.9, (first, second)
        low = _disk(s)
        assert low["low"] is True, low
        assert "LOW" in s.cli("status").stdout
        assert s.exec({"argv": ["true"], "privileged": False})["ok"] is True  # still writing: a warning, not a stop

        ballast.unlink()
        cleared = wait_log_events(runtime / "logs", "journal.disk.recovered", 1)[0]
        assert cleared["message_id"] == NOTICES["journal.disk.recovered"] and cleared["free_bytes"] >= 16 * MiB
        assert _disk(s)["low"] is False
        warned = len(_log_events(runtime, "journal.disk.low"))
        time.sleep(1.5)  # a span in which a low disk would have been warned about again: nothing may come
        assert len(_log_events(runtime, "journal.disk.low")) == warned
    finally:
        stop_stack(s)


def _ts(entry: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()
