"""Every job is its own transient service (issue 22): a full root job by
default, confined only by its rule's sandbox, and nothing left behind.

Each confinement test has a control: the same kind of command from a rule
without a sandbox does what the sandbox then stops.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest

POLICY = """\
rules:
  - name: systest-units-full
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/mount, -t, tmpfs, none, /mnt/airlock-systest]
      - [/usr/bin/cat, /proc/self/status]
      - [/usr/bin/touch, /etc/airlock-systest-rw]
      - [/usr/bin/cat, /proc/self/net/dev]
  - name: systest-units-read-only
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/touch, /etc/airlock-systest-ro]
    sandbox: {read_only: true}
  - name: systest-units-no-network
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/cat, /proc/net/dev]
    sandbox: {private_network: true, no_new_privileges: true}
"""


def op() -> str:
    return f"systest-units-{uuid.uuid4().hex[:16]}"


def _field(status: str, name: str) -> str:
    match = re.search(rf"^{name}:\s*(\S+)", status, re.MULTILINE)
    assert match, status
    return match.group(1)


def _job_units(system) -> str:
    return system.c.run(["systemctl", "list-units", "--all", "--no-legend", "--plain", "airlock-job-*"]).stdout.strip()


@pytest.fixture(scope="module", autouse=True)
def units_policy(system):
    system.c.write("/etc/airlock/policy.d/55-systest-units.yaml", POLICY)
    system.c.run(["systemctl", "try-reload-or-restart", "airlock-approval.service"])
    yield
    system.c.run(["rm", "-f", "/etc/airlock/policy.d/55-systest-units.yaml"])
    system.c.run(["systemctl", "try-reload-or-restart", "airlock-approval.service"])


def test_a_job_is_a_transient_unit_with_its_evidence(system) -> None:
    # No sandbox in its rule: a transient scope (issue 50: systemd-run --scope's cost, not a service's).
    code, envelope, r = system.run_json(
        "/usr/bin/cat", "/proc/self/status", privileged=True, extra=("--operation-id", op())
    )
    assert code == 0 and envelope.get("ok"), r
    data = envelope["data"]
    assert data["containment"] == "service", data
    stage = data["stages"][0]
    assert stage["unit"].startswith("airlock-job-systest-units-") and stage["unit"].endswith(".scope"), stage
    assert stage["exit_code"] == 0
    assert "cpu_usec" in stage and "memory_peak_bytes" in stage  # None where the cgroup has no accounting
    # Gone once the evidence is back: nothing named airlock-job-* is left.
    assert stage["unit"] not in _job_units(system)


def test_a_root_job_is_a_full_root_job_by_default(system) -> None:
    import base64

    code, envelope, r = system.run_json(
        "/usr/bin/cat", "/proc/self/status", privileged=True, extra=("--operation-id", op())
    )
    assert code == 0, r
    status = base64.b64decode(envelope["data"]["stdout"]).decode()
    init = system.c.run(["cat", "/proc/1/status"]).stdout
    runner_pid = system.main_pid("airlock-runner.service")
    runner = system.c.run(["cat", f"/proc/{runner_pid}/status"]).stdout if runner_pid else ""
    # Everything this machine's root has (PID 1's set), no seccomp filter, no NoNewPrivileges.
    assert _field(status, "CapEff") == _field(init, "CapEff"), status
    assert _field(status, "CapBnd") == _field(init, "CapBnd"), status
    assert _field(status, "NoNewPrivs") == "0", status
    assert _field(status, "Seccomp_filters") == _field(init, "Seccomp_filters"), status  # nspawn's own only
    if runner:  # the control: the runner itself is confined, and jobs no longer inherit it
        assert int(_field(runner, "CapBnd"), 16) < int(_field(status, "CapBnd"), 16), runner
        assert _field(runner, "NoNewPrivs") == "1"


def test_an_approved_mount_works(system) -> None:
    system.c.run(["mkdir", "-p", "/mnt/airlock-systest"])
    try:
        code, envelope, r = system.run_json(
            "/usr/bin/mount",
            "-t",
            "tmpfs",
            "none",
            "/mnt/airlock-systest",
            privileged=True,
            extra=("--operation-id", op()),
        )
        assert code == 0 and envelope["data"]["stages"][0]["exit_code"] == 0, r
        fs = system.c.run(["findmnt", "-n", "-o", "FSTYPE", "/mnt/airlock-systest"], check=False).stdout.strip()
        assert fs == "tmpfs"
    finally:
        system.c.run(["umount", "/mnt/airlock-systest"], check=False)


def test_read_only_sandbox_cannot_write_etc(system) -> None:
    system.c.run(["rm", "-f", "/etc/airlock-systest-rw", "/etc/airlock-systest-ro"])
    code, _envelope, r = system.run_json(
        "/usr/bin/touch", "/etc/airlock-systest-rw", privileged=True, extra=("--operation-id", op())
    )
    assert code == 0, r  # the control: a rule without a sandbox writes /etc
    assert _envelope["data"]["stages"][0]["unit"].endswith(".scope"), _envelope
    assert system.c.run(["test", "-e", "/etc/airlock-systest-rw"], check=False).returncode == 0
    code, envelope, r = system.run_json(
        "/usr/bin/touch", "/etc/airlock-systest-ro", privileged=True, extra=("--operation-id", op())
    )
    assert code != 0, r
    assert envelope["data"]["stages"][0]["unit"].endswith(".service"), envelope  # a sandbox: a service
    import base64

    stderr = base64.b64decode(envelope["data"]["stages"][0]["stderr"]).decode()
    assert "Read-only file system" in stderr, stderr
    assert system.c.run(["test", "-e", "/etc/airlock-systest-ro"], check=False).returncode == 1


def test_private_network_sandbox_has_only_lo(system) -> None:
    import base64

    def interfaces(envelope) -> list[str]:  # /proc/net/dev: the job's own network namespace
        text = base64.b64decode(envelope["data"]["stdout"]).decode()
        return sorted(line.split(":", 1)[0].strip() for line in text.splitlines() if ":" in line)

    code, envelope, r = system.run_json(
        "/usr/bin/cat", "/proc/self/net/dev", privileged=True, extra=("--operation-id", op())
    )
    assert code == 0, r
    control = interfaces(envelope)
    assert "lo" in control and len(control) > 1, control  # the control: the machine has other interfaces
    code, envelope, r = system.run_json(
        "/usr/bin/cat", "/proc/net/dev", privileged=True, extra=("--operation-id", op())
    )
    assert code == 0, r
    assert interfaces(envelope) == ["lo"], envelope["data"]


def test_policy_check_shows_the_sandbox(system) -> None:
    r = system.airlock(
        "policy",
        "check",
        "--user",
        system.AGENT,
        "--",
        "/usr/bin/touch",
        "/etc/airlock-systest-ro",
        user=system.OPERATOR,
    )
    assert r.returncode == 0, r
    assert "sandbox: read_only=True" in r.stdout, r.stdout
    r = system.airlock(
        "policy",
        "check",
        "--user",
        system.AGENT,
        "--",
        "/usr/bin/touch",
        "/etc/airlock-systest-rw",
        user=system.OPERATOR,
    )
    assert "sandbox: none (a full job, as with sudo)" in r.stdout, r.stdout


def test_timeout_and_cancel_stop_the_unit_and_leave_nothing(system) -> None:
    timed = op()
    r = system.airlock(
        "run",
        "--no-privilege",
        "--timeout",
        "2",
        "--operation-id",
        timed,
        "--",
        "/usr/bin/dash",
        "-c",
        "setsid sleep 1011 & sleep 1012",
        timeout=60,
    )
    assert r.returncode in (128 + 15, 128 + 9), r
    cancelled = op()
    proc = system.c.popen(
        [
            "airlock",
            "run",
            "--no-privilege",
            "--operation-id",
            cancelled,
            "--",
            "/usr/bin/dash",
            "-c",
            "setsid sleep 1013 & sleep 1014",
        ],
        user=system.AGENT,
    )
    system.c.wait_for(["pgrep", "-f", "^sleep 1014"], timeout=20)
    assert cancelled in _job_units(system)  # running as its own unit
    r = system.airlock("cancel", cancelled, "--reason", "systest", user=system.OPERATOR)
    assert r.returncode == 0, r
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        _job_units(system) or system.c.run(["pgrep", "-f", "^sleep 101[1-4]"], check=False).returncode == 0
    ):
        time.sleep(0.2)
    assert system.c.run(["pgrep", "-a", "-f", "^sleep 101[1-4]"], check=False).returncode == 1
    assert _job_units(system) == ""


def test_runner_exposure_is_at_most_2_5(system) -> None:
    r = system.c.run(["systemd-analyze", "security", "--no-pager", "airlock-runner.service"], check=False)
    match = re.search(r"Overall exposure level for airlock-runner\.service: ([0-9.]+)", r.stdout)
    assert match, r
    assert float(match.group(1)) <= 2.5, r.stdout[-2000:]


def test_a_job_that_exits_leaving_a_daemon_leaves_nothing(system) -> None:
    # A scope outlives its first process (a service stops with it): what the job left is swept.
    r = system.airlock(
        "run", "--no-privilege", "--operation-id", op(), "--", "/usr/bin/dash", "-c", "setsid sleep 1021 & true"
    )
    assert r.returncode == 0, r
    assert system.c.run(["pgrep", "-a", "-f", "^sleep 1021"], check=False).returncode == 1
    assert _job_units(system) == ""
