"""The emergency brake survives `systemctl restart` and a reboot (issue 16).

`airlock hold` is journaled and airlock-approval reads it back from the
journal when it starts, so neither a restart of the unit nor a reboot of the
whole container (a clean poweroff and a fresh boot of the same root: /run is
empty again, /var/lib/airlock is not) lifts it.  The control: before the
hold, the same policy-allowed command runs at once.

Named to run just before test_8_upgrade_purge, which removes the package.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest


def _status(system) -> dict:
    r = system.airlock("status", "--json", user=system.OPERATOR, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["data"]


def _runs_at_once(system) -> None:
    r = system.airlock("run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/true")
    assert r.returncode == 0, r


def _waits_for_an_operator(system) -> None:
    """A policy-allowed command now waits (rule `hold`); deny it so nothing runs."""
    marker = uuid.uuid4().hex
    proc = system.c.popen(
        [
            "airlock",
            "run",
            "--no-privilege",
            "--reason",
            marker,
            "--operation-id",
            f"systest-{marker}",
            "--",
            "/usr/bin/true",
        ],
        user=system.AGENT,
    )
    deadline = time.monotonic() + 30
    found = None
    while found is None and time.monotonic() < deadline:
        r = system.airlock("pending", "--json", user=system.OPERATOR, check=True)
        for item in json.loads(r.stdout.strip().splitlines()[-1])["data"]["pending"]:
            if item.get("reason") == marker:
                found = item
        time.sleep(0.2)
    if found is None:
        proc.kill()
        pytest.fail(f"the held request never showed up in `airlock pending`: {proc.communicate()}")
    assert found["rule"] == "hold", found
    assert system.airlock("deny", found["request_id"], "--reason", "held", user=system.OPERATOR).returncode == 0
    proc.communicate(timeout=30)
    assert proc.returncode == 126


def _held_by_op1(system, reason: str) -> dict:
    status = _status(system)
    assert status["hold"] is True and status["hold_reason"] == reason, status
    assert status["hold_by"] == system.OPERATOR and status["hold_since"], status
    return status


def test_a_hold_survives_restart_of_approval_and_a_reboot(system) -> None:
    _runs_at_once(system)
    reason = f"systest incident {uuid.uuid4().hex[:8]}"
    assert system.airlock("hold", "--reason", reason, user=system.OPERATOR).returncode == 0
    try:
        before = _held_by_op1(system, reason)
        old_pid = system.main_pid("airlock-approval.service")
        system.c.run(["systemctl", "restart", "airlock-approval.service"])
        after = _held_by_op1(system, reason)
        assert system.main_pid("airlock-approval.service") not in (0, old_pid)
        assert after["hold_since"] == before["hold_since"]
        _waits_for_an_operator(system)

        system.c.shutdown()  # a clean poweroff of the container ...
        system.c.leader = 0
        system.c.boot()  # ... and a fresh boot of the same root
        assert system.active("airlock-approval.service") != "active"  # nothing started it yet
        rebooted = _held_by_op1(system, reason)
        assert rebooted["hold_since"] == before["hold_since"]
        _waits_for_an_operator(system)
    finally:
        system.airlock("release", user=system.OPERATOR)
    assert _status(system)["hold"] is False
    _runs_at_once(system)
    system.audit_verify()
