"""The container root builds from scratch, and a root that cannot be built fails the run (issue 44).

A cached root hides what a fresh machine meets: on one, debootstrap could not configure
python3-cryptography (a virtual dependency debootstrap does not resolve), every system test
skipped and CI passed.  These run first (the modules are numbered).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nspawn import BUILT_THIS_RUN, CACHE_DIR, INCLUDE, SUITE, build_root, cached_root, cannot_run, root_problems

HERE = Path(__file__).resolve().parent


def test_the_root_builds_from_scratch() -> None:
    """debootstrap with today's archive and INCLUDE gives a root dpkg calls sound, with every package asked for."""
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        cannot_run("building a root needs root and debootstrap")
    root = cached_root()
    if root in BUILT_THIS_RUN:
        built, where = root, "the cache, built by this run"
    else:
        built = CACHE_DIR / f"scratch-{os.getpid()}"
        shutil.rmtree(built, ignore_errors=True)
        started = time.monotonic()
        try:
            build_root(built, CACHE_DIR / "scratch.log")
        except Exception as exc:
            shutil.rmtree(built, ignore_errors=True)
            pytest.fail(f"the root no longer builds from scratch: {exc}", pytrace=False)
        where = f"a scratch copy built in {time.monotonic() - started:.0f}s"
    try:
        assert root_problems(built) == "", where
        assert (built / "usr/lib/systemd/systemd").exists(), where
        print(f"[systest] {SUITE} root with {len(INCLUDE)} packages asked for: sound ({where})", flush=True)
    finally:
        if built != root:
            shutil.rmtree(built, ignore_errors=True)


def test_an_unbuildable_root_fails_the_run_instead_of_skipping(tmp_path: Path) -> None:
    """The same suite, with a mirror that refuses every connection and an empty cache: it fails, never skips."""
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        cannot_run("needs root and debootstrap")
    env = {k: v for k, v in os.environ.items() if k not in ("AIRLOCK_TEST_COUNTS",)}
    env |= {"AIRLOCK_SYSTEST_DIR": str(tmp_path / "cache"), "AIRLOCK_SYSTEST_MIRROR": "http://127.0.0.1:9/debian"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            f"{HERE}/test_1_install.py::test_only_the_sockets_are_enabled_and_listening",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE.parents[1],
        timeout=600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "could not run on a host that has root and every tool: debootstrap failed" in out, out
