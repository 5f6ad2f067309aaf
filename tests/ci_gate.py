"""What a test run tested: under CI a skip fails the run, and each suite's counts are collected.

Issue 44: on a fresh machine every system test once skipped (the container root could not be
built) and CI still passed.  Loaded by tests/conftest.py, and as ``-p ci_gate`` by its own test.
"""

from __future__ import annotations

import os

import pytest


def _outcomes(session: pytest.Session) -> dict[str, int]:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {}) if reporter is not None else {}
    counts = {}
    for key in ("passed", "failed", "skipped", "error", "xfailed", "xpassed"):
        # The call phase counts a test; a setup that errored or skipped is reported in its setup phase.
        counts[key] = len([r for r in stats.get(key, ()) if getattr(r, "when", "call") in ("call", "setup")])
    return counts


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI=true a skipped test fails the run; AIRLOCK_TEST_COUNTS collects each suite's counts.

    Tests that need root or systemd skip with a reason on a developer's machine; CI runs as root
    and must run them, so a skip there means something it needed was missing (a host tool, the
    container root) and the run has not passed.
    """
    counts = _outcomes(session)
    suite = os.environ.get("AIRLOCK_SUITE") or " ".join(str(a) for a in session.config.args) or "tests"
    line = (
        f"{suite}: {counts['passed']} passed, {counts['failed'] + counts['error']} failed, {counts['skipped']} skipped"
    )
    if path := os.environ.get("AIRLOCK_TEST_COUNTS"):
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    if os.environ.get("CI") == "true" and counts["skipped"] and session.exitstatus == 0:
        print(f"\nCI: {counts['skipped']} test(s) skipped, and a suite that skipped has not passed ({line})")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
