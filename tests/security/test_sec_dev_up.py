"""`airlock dev up` is safe in a shared /tmp (issue 39, items 8 and 9).

dev up run as root trusts its runtime folder with root's power: it wrote the
composed config with ``write_text`` (following links) into a folder it made
with ``exist_ok``, so a local user who made the folder first could point
``airlock.yaml`` at any file and have root overwrite it, and, owning the
folder, replace ``operator.sock`` so the developer's ``airlock pending``
talked to the attacker.  It also wrote the config (inline notify secrets
included) and its logs 0644 in a 0755 folder.

Attacks: mallory pre-creates the runtime folder with ``airlock.yaml`` a link
to a root file; a root-owned but world-writable folder.  Both are refused
before anything is written, and the file is untouched.  Controls: the same
command on a fresh path starts the stack (dev up works), and a folder of
root's with a planted link in it has the link replaced, not followed; the
config and logs it writes are 0600 and a folder it makes is 0700.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import needs_root, root_dir, run_as, throwaway_user

from support import start_stack, stop_stack

pytestmark = needs_root

PRECIOUS = "root's precious file\n"


@pytest.fixture
def victim() -> Iterator[Path]:
    folder = root_dir()
    path = folder / "precious"
    path.write_text(PRECIOUS)
    yield path
    shutil.rmtree(folder)


@pytest.fixture
def mallory() -> Iterator[Any]:
    with throwaway_user("aldev") as user:
        yield user


def dev_up(runtime: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "airlock", "dev", "up", "--runtime-dir", str(runtime)]
    if config is not None:
        argv += ["--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_folder_another_user_made_is_refused_and_nothing_is_written(mallory: Any, victim: Path) -> None:
    runtime = Path("/tmp") / f"aldev-{os.urandom(4).hex()}"
    try:
        run_as(mallory, "mkdir", "-m", "0777", str(runtime))
        run_as(mallory, "ln", "-s", str(victim), str(runtime / "airlock.yaml"))
        result = dev_up(runtime)
        assert result.returncode == 2, result.stderr
        assert f"belongs to uid {mallory.pw_uid}, not to you" in result.stderr
        assert victim.read_text() == PRECIOUS
        assert sorted(p.name for p in runtime.iterdir()) == ["airlock.yaml"]  # no socket, no log of root's there
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_folder_others_may_write_is_refused(victim: Path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="aldev", dir="/tmp"))
    try:
        os.chmod(runtime, 0o1777)
        os.symlink(victim, runtime / "airlock.yaml")
        result = dev_up(runtime)
        assert result.returncode == 2 and "writable by group or others" in result.stderr, result.stderr
        assert victim.read_text() == PRECIOUS
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_control_a_fresh_folder_runs_private_and_a_planted_link_is_replaced(tmp_path: Path, victim: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text(
        "notify:\n  channels:\n    - {type: webhook, url: 'http://127.0.0.1:9/x', secret: s3cr3t-0123456789abcdef}\n"
    )
    config.chmod(0o600)
    runtime = tmp_path / "fresh" / "rt"
    stack = start_stack(runtime, config)
    try:
        assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
        composed = runtime / "airlock.yaml"
        assert stat.S_IMODE(composed.stat().st_mode) == 0o600 and "s3cr3t" in composed.read_text()
        logs = list((runtime / "logs").glob("*.log"))
        assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)
        assert stack.native("ping")["ok"] is True
    finally:
        stop_stack(stack)
    # A link planted in a folder of root's (0700): the config replaces the link, the target is untouched.
    composed.unlink()
    composed.symlink_to(victim)
    again = start_stack(runtime)
    try:
        assert not composed.is_symlink() and victim.read_text() == PRECIOUS
    finally:
        stop_stack(again)
