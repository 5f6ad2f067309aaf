"""A job that outlives its timeout is killed with everything it spawned,
including processes that left its process group: its unit holds them all."""

from __future__ import annotations

import time
import uuid


def test_timeout_kills_the_whole_scope(system) -> None:
    marker = uuid.uuid4().hex[:12]
    script = "sleep 1001 & setsid sleep 1002 & (setsid sh -c 'sleep 1003 & sleep 1004' &) ; sleep 1005"
    proc = system.c.popen(
        [
            "airlock",
            "run",
            "--no-privilege",
            "--timeout",
            "4",
            "--operation-id",
            f"systest-{marker}",
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
        user=system.AGENT,
    )
    # While it runs, the jobs slice lists its scope and every process in it.
    deadline = time.monotonic() + 3.5
    status = ""
    while time.monotonic() < deadline:
        status = system.c.run(
            ["systemctl", "status", "--no-pager", "--lines=0", "airlock-jobs.slice"], check=False
        ).stdout
        if all(f"sleep {n}" in status for n in (1001, 1002, 1003, 1004)):
            break
        time.sleep(0.2)
    # Its rule has no sandbox: a scope (runner/forker.py), as systemd-run --scope makes one.
    assert "airlock-job-" in status and ".scope" in status, status
    for n in (1001, 1002, 1003, 1004):
        assert f"sleep {n}" in status, status

    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + 15 or proc.returncode == 128 + 9, (proc.returncode, out, err)
    assert b"timed out" in err, err
    # Nothing is left: not the daemonised grandchildren, not the unit.
    r = system.c.run(["pgrep", "-a", "-f", "sleep 100[1-5]"], check=False)
    assert r.returncode == 1, r
    scopes = system.c.run(["systemctl", "list-units", "--all", "--no-legend", "--plain", "airlock-job-*"]).stdout
    assert f"systest-{marker}" not in scopes, scopes


def test_operator_cancel_kills_the_whole_scope(system) -> None:
    operation = f"systest-cancel-{uuid.uuid4().hex[:12]}"
    proc = system.c.popen(
        [
            "airlock",
            "run",
            "--no-privilege",
            "--operation-id",
            operation,
            "--",
            "/bin/sh",
            "-c",
            "setsid sleep 1007 & sleep 1008",
        ],
        user=system.AGENT,
    )
    # Anchored: before exec, the unit's exec helper also carries "sleep 1007"
    # in its command line; the job runs once sleep itself does.
    system.c.wait_for(["pgrep", "-f", "^sleep 1008"], timeout=20)
    started = time.monotonic()
    r = system.airlock("cancel", operation, "--reason", "systest", user=system.OPERATOR)
    assert r.returncode == 0, r
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - started < 15
    assert proc.returncode != 0, (out, err)
    r = system.c.run(["pgrep", "-a", "-f", "sleep 100[78]"], check=False)
    assert r.returncode == 1, r
