"""CI fails when it tested nothing (issue 44): a skip under CI=true fails the run, and the counts are said."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SUITE = """
import pytest

def test_runs():
    assert 1 + 1 == 2

def test_needs_something():
    pytest.skip("needs a container root")
"""


def _run(tmp_path: Path, *, ci: bool) -> tuple[int, str, str]:
    (tmp_path / "test_suite.py").write_text(SUITE)
    counts = tmp_path / "counts"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "AIRLOCK_TEST_COUNTS", "AIRLOCK_SUITE")}
    env |= {"PYTHONPATH": str(TESTS), "AIRLOCK_TEST_COUNTS": str(counts), "AIRLOCK_SUITE": "demo"}
    if ci:
        env["CI"] = "true"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "ci_gate",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_suite.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout, counts.read_text() if counts.exists() else ""


def test_a_skip_passes_on_a_developers_machine(tmp_path: Path) -> None:
    rc, out, counts = _run(tmp_path, ci=False)
    assert rc == 0, out
    assert counts == "demo: 1 passed, 0 failed, 1 skipped\n"


def test_a_skip_fails_under_ci(tmp_path: Path) -> None:
    rc, out, counts = _run(tmp_path, ci=True)
    assert rc == 1, out
    assert "1 test(s) skipped, and a suite that skipped has not passed" in out
    assert counts == "demo: 1 passed, 0 failed, 1 skipped\n"
