"""An agent runs what the policy allows, and every step is on record."""

from __future__ import annotations

import base64
import json
import uuid


def op() -> str:
    return f"systest-{uuid.uuid4().hex}"


def test_unprivileged_command_runs_as_the_agent(system) -> None:
    r = system.airlock("run", "--no-privilege", "--operation-id", op(), "--", "/usr/bin/id", "-un")
    assert (r.returncode, r.stdout.strip()) == (0, system.AGENT), r


def test_privileged_command_runs_as_root(system) -> None:
    r = system.airlock("run", "--operation-id", op(), "--", "/usr/bin/id", "-u")
    assert (r.returncode, r.stdout.strip()) == (0, "0"), r
    r = system.airlock("run", "--operation-id", op(), "--", "/usr/bin/cat", "/etc/shadow")
    assert r.returncode == 0 and r.stdout.startswith("root:"), r


def test_exit_code_and_streams_come_back(system) -> None:
    r = system.airlock(
        "run", "--no-privilege", "--operation-id", op(), "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 3"
    )
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n"), r


def test_a_denied_command_exits_126_and_does_not_run(system) -> None:
    system.c.run(["touch", "/tmp/systest-keep"])
    r = system.airlock("run", "--operation-id", op(), "--", "/usr/bin/rm", "-f", "/tmp/systest-keep")
    assert r.returncode == 126, r
    system.c.run(["test", "-e", "/tmp/systest-keep"])


def test_jobs_run_as_services_of_the_jobs_slice(system) -> None:
    code, envelope, r = system.run_json("/usr/bin/true", extra=("--operation-id", op()))
    assert code == 0 and envelope.get("ok"), r
    data = envelope["data"]
    assert data["containment"] == "service", data
    assert data.get("scope_unit", "").startswith("airlock-job-"), data


def test_journalctl_follows_one_request_across_units(system) -> None:
    code, envelope, r = system.run_json("/usr/bin/echo", "traced", extra=("--operation-id", op()))
    assert code == 0 and base64.b64decode(envelope["data"]["stdout"]) == b"traced\n", r
    request_id = envelope["id"]
    out = system.c.run(["journalctl", "--no-pager", "-o", "json", f"AIRLOCK_REQUEST_ID={request_id}"]).stdout
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    units = {e.get("_SYSTEMD_UNIT") for e in entries}
    assert len(units & set(system.SERVICES)) >= 3, units
    assert all(e.get("MESSAGE_ID") for e in entries), entries


def test_journalctl_u_runner_says_who_ran_what_as_root(system) -> None:
    """Issue 32: `journalctl -u airlock-runner` reads like sudo's log: who, as whom, where, what."""
    code, envelope, r = system.run_json("/usr/bin/id", "-u", privileged=True, extra=("--operation-id", op()))
    assert code == 0, r
    request_id = envelope["id"]
    out = system.c.run(["journalctl", "--no-pager", "-o", "cat", "-u", "airlock-runner.service"]).stdout
    said = [line for line in out.splitlines() if line.endswith(f"REQUEST={request_id}")]
    started = [line for line in said if line.startswith(f"{system.AGENT} : USER=root ; CWD=")]
    assert started and started[0].endswith(f" ; COMMAND=/usr/bin/id -u ; REQUEST={request_id}"), out[-3000:]
    assert any(line.startswith(f"{system.AGENT} : finished ; EXIT=0 ;") for line in said), said


def test_journalctl_x_shows_catalog_text(system) -> None:
    code, envelope, r = system.run_json("/usr/bin/true", extra=("--operation-id", op()))
    assert code == 0, r
    out = system.c.run(["journalctl", "--no-pager", "-x", f"AIRLOCK_REQUEST_ID={envelope['id']}"]).stdout
    assert "Subject:" in out and "Defined-By: airlock" in out, out


def test_audit_chain_verifies(system) -> None:
    system.audit_verify()
    # an agent is not an operator
    r = system.airlock("audit", "verify", user=system.AGENT)
    assert r.returncode != 0, r


def test_services_run_as_notify_services_with_a_watchdog(system) -> None:
    assert system.airlock("run", "--no-privilege", "--operation-id", op(), "--", "/usr/bin/true").returncode == 0
    users = {
        "airlock-intake.service": "airlock-intake",
        "airlock-approval.service": "airlock-approval",
        "airlock-journal.service": "airlock-journal",
        "airlock-runner.service": "root",
    }
    for service, user in users.items():
        show = system.c.run(
            ["systemctl", "show", "-p", "Type,NotifyAccess,WatchdogUSec,StatusText,MainPID", service]
        ).stdout
        props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        assert (props["Type"], props["NotifyAccess"], props["WatchdogUSec"]) == ("notify", "main", "30s"), props
        assert props["StatusText"], props  # STATUS= from sd_notify
        owner = system.c.run(["ps", "-o", "user=", "-p", props["MainPID"]]).stdout.strip()
        assert owner == user, (service, owner)


def _status_field(text: str, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(name + ":"))


def test_jobs_do_not_inherit_the_runners_sandbox(system) -> None:
    # docs/security.md: a job is its own service; only its rule's sandbox: confines it.
    r = system.airlock("run", "--no-privilege", "--operation-id", op(), "--", "/usr/bin/cat", "/proc/self/status")
    assert r.returncode == 0, r
    init = system.c.run(["cat", "/proc/1/status"]).stdout
    assert _status_field(r.stdout, "NoNewPrivs") == "0"
    # No filter of the runner's: only what the container's PID 1 has (nspawn installs one).
    assert _status_field(r.stdout, "Seccomp_filters") == _status_field(init, "Seccomp_filters")
    r = system.airlock("run", "--operation-id", op(), "--", "/usr/bin/dash", "-c", "cat /proc/self/status")
    assert r.returncode == 0, r
    assert _status_field(r.stdout, "CapBnd") == _status_field(init, "CapBnd"), "a root job has root's full set"
