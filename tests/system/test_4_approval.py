"""Requests the policy sends to ask: an operator approves one, denies
another, and a third waits out the approval timeout."""

from __future__ import annotations

import json
import time
import uuid

import pytest


def _pending(system) -> list[dict]:
    r = system.airlock("pending", "--json", user=system.OPERATOR, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["data"]["pending"]


def _ask(system, *argv: str):
    """Start `airlock run` for a command no rule covers; return the process and its request ID."""
    marker = uuid.uuid4().hex
    proc = system.c.popen(
        ["airlock", "run", "--reason", marker, "--operation-id", f"systest-{marker}", "--", *argv], user=system.AGENT
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for item in _pending(system):
            if item["request"].get("reason") == marker or item.get("reason") == marker or marker in json.dumps(item):
                return proc, item["request_id"]
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the request never showed up in `airlock pending`: {proc.communicate()}")


def test_operator_approves(system) -> None:
    proc, request_id = _ask(system, "/usr/bin/hostname")
    r = system.airlock("approve", request_id, "--reason", "systest", user=system.OPERATOR)
    assert r.returncode == 0, r
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (out, err)
    assert out.decode().strip(), err


def test_operator_denies(system) -> None:
    proc, request_id = _ask(system, "/usr/bin/hostname")
    r = system.airlock("deny", request_id, "--reason", "systest", user=system.OPERATOR)
    assert r.returncode == 0, r
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 126, (out, err)
    assert out == b""


def test_an_agent_cannot_approve(system) -> None:
    proc, request_id = _ask(system, "/usr/bin/hostname")
    try:
        r = system.airlock("approve", request_id, user=system.AGENT)
        assert r.returncode != 0, r
    finally:
        system.airlock("deny", request_id, user=system.OPERATOR)
        proc.communicate(timeout=30)


def test_nobody_decides_and_the_request_times_out(system) -> None:
    system.set_config("approval:\n  timeout_seconds: 3\n")
    system.restart_services()
    try:
        started = time.monotonic()
        r = system.airlock(
            "run", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/hostname", timeout=60
        )
        assert r.returncode == 124, r
        assert 2.5 < time.monotonic() - started < 30
        assert r.stdout == ""
    finally:
        system.restore_config()
        system.restart_services()


def _approval_says(system, event: str) -> int:
    """How many times airlock-approval has logged ``event`` (journald, this boot)."""
    out = system.c.run(["journalctl", "-b", "-u", "airlock-approval", "-o", "cat", "--no-pager"], check=False).stdout
    return sum(1 for line in out.splitlines() if event in line)


def _wait_until_approval_says(system, event: str, before: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _approval_says(system, event) <= before:
        assert time.monotonic() < deadline, f"airlock-approval did not log {event} within {timeout:.0f}s"
        time.sleep(0.2)


def test_reload_applies_a_policy_change_and_refuses_a_bad_one(system) -> None:
    def run_uname():
        return system.airlock(
            "run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/uname", "-s"
        )

    system.set_config("approval:\n  timeout_seconds: 2\n")
    system.restart_services()
    try:
        assert run_uname().returncode == 124  # no rule: ask, and nobody answers
        system.c.write(
            "/etc/airlock/policy.d/60-systest-reload.yaml",
            'rules:\n  - name: systest-reload\n    decision: allow\n    commands: [[/usr/bin/uname, "..."]]\n',
        )
        assert system.active("airlock-approval.service") == "active"
        pid = system.main_pid("airlock-approval.service")
        # `systemctl reload` (kill -HUP) returns before the service has re-read the policy: wait for
        # the service to say it did (docs/configuration.md), not for a fixed time.
        reloaded = _approval_says(system, "policy.reloaded")
        system.c.run(["systemctl", "reload", "airlock-approval.service"])
        _wait_until_approval_says(system, "policy.reloaded", reloaded)
        assert system.main_pid("airlock-approval.service") == pid  # reloaded, not restarted
        r = run_uname()
        assert (r.returncode, r.stdout.strip()) == (0, "Linux"), r

        # A broken policy file is refused on reload; the running policy stays.
        # A broken policy file is refused on reload; the running policy stays, and the reload fails
        # (ExecReload= checks the files, issue 44) instead of looking like a success.
        system.c.write("/etc/airlock/policy.d/61-systest-broken.yaml", "rules:\n  - name: broken\n")
        rejected = _approval_says(system, "approval.policy.rejected")
        reload = system.c.run(["systemctl", "reload", "airlock-approval.service"], check=False)
        assert reload.returncode != 0, reload
        _wait_until_approval_says(system, "approval.policy.rejected", rejected)
        assert system.active("airlock-approval.service") == "active"
        assert run_uname().returncode == 0
        status = system.airlock("status", user=system.OPERATOR)
        assert "REFUSED" in status.stdout and "61-systest-broken.yaml" in status.stdout, status
    finally:
        system.c.run(
            ["rm", "-f", "/etc/airlock/policy.d/60-systest-reload.yaml", "/etc/airlock/policy.d/61-systest-broken.yaml"]
        )
        system.restore_config()
        system.restart_services()


def test_the_example_notify_hook_works_inside_the_sandbox(system) -> None:
    # The shipped example runs as airlock-approval, in that service's sandbox
    # (no network, read-only file system): its syslog line must still arrive.
    system.c.run(["test", "-x", "/etc/airlock/notify-example.sh"])
    system.set_config("approval:\n  timeout_seconds: 3\n  notify_command: [/etc/airlock/notify-example.sh]\n")
    system.restart_services()
    try:
        marker = uuid.uuid4().hex
        r = system.airlock(
            "run", "--reason", marker, "--operation-id", f"systest-{marker}", "--", "/usr/bin/hostname", timeout=60
        )
        assert r.returncode == 124, r
        deadline = time.monotonic() + 15
        while True:
            log = system.c.run(["journalctl", "--no-pager", "-o", "cat", "-t", "airlock-notify"]).stdout
            if marker in log or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        line = next((x for x in log.splitlines() if marker in x), "")
        assert "pending" in line and system.AGENT in line and "/usr/bin/hostname" in line, log
    finally:
        system.restore_config()
        system.restart_services()


def test_session_tokens_name_the_session_and_die_with_the_service(system) -> None:
    r = system.airlock(
        "token", "issue", "--session", "systest-nightly", "--user", system.AGENT, "--ttl", "10m", user=system.OPERATOR
    )
    assert r.returncode == 0, r
    token = r.stdout.strip()
    assert token and "\n" not in token
    # The agent keeps it in a file of its own (a token is never taken from argv).
    path = f"/tmp/systest-token-{uuid.uuid4().hex}"
    system.c.write(path, token + "\n", mode=0o600)
    system.c.run(["chown", system.AGENT, path])
    claimed = system.run_json(
        "/usr/bin/true",
        extra=("--operation-id", f"systest-{uuid.uuid4().hex}", "--token-file", path, "--session", "claimed"),
    )
    assert claimed[0] == 125 and claimed[1].get("error", {}).get("code") == "invalid_arguments", claimed[2]
    code, envelope, r = system.run_json(
        "/usr/bin/true", extra=("--operation-id", f"systest-{uuid.uuid4().hex}", "--token-file", path)
    )
    assert code == 0, r
    out = system.c.run(["journalctl", "--no-pager", "-o", "json", f"AIRLOCK_REQUEST_ID={envelope['id']}"]).stdout
    sessions = {json.loads(line).get("AIRLOCK_SESSION") for line in out.splitlines() if line.strip()} - {None}
    assert sessions == {"systest-nightly"}, sessions  # from the token, not from the request

    # The token store lives in airlock-approval's memory: a restart revokes all (fail closed).
    system.c.run(["systemctl", "restart", "airlock-approval.service"])
    code, envelope, r = system.run_json(
        "/usr/bin/true", extra=("--operation-id", f"systest-{uuid.uuid4().hex}", "--token-file", path)
    )
    assert code == 125 and envelope.get("error", {}).get("code") == "unauthorized", r


def test_a_policy_typo_written_while_approval_is_idle_leaves_the_gateway_up(system) -> None:
    """Issue 44: approval idle-exits; a typo is written; the next request starts it on the refused files.

    Before, approval exited 78, hit the start limit and failed both of its sockets: agents and
    operators lost the gateway. Now it starts on the last policy it accepted and says so.
    """
    dropin = "/etc/airlock/policy.d/62-systest-typo.yaml"
    try:
        ok = system.airlock("run", "--no-privilege", "--", "/usr/bin/true")  # approval accepts the policy
        assert ok.returncode == 0, ok
        system.c.run(["systemctl", "stop", "airlock-approval.service"])  # as an idle exit leaves it
        system.c.write(dropin, "rules:\n  - name: typo\n    decision: allow\n    comands: [[/usr/bin/id]]\n")
        r = system.airlock("run", "--no-privilege", "--", "/usr/bin/true")  # starts approval on the typo
        said = system.c.run(["journalctl", "-u", "airlock-approval", "-n", "30", "--no-pager"]).stdout
        assert r.returncode == 0, f"{r}\n{said}"  # the kept policy's allow rule still decides
        assert system.active("airlock-approval.service") == "active", said
        for socket in ("airlock-approval.socket", "airlock-operator.socket"):
            assert system.active(socket) == "active", socket
        status = system.airlock("status", user=system.OPERATOR)
        assert status.returncode == 0, status
        assert "REFUSED" in status.stdout and "62-systest-typo.yaml:4:5" in status.stdout, status
        check = system.airlock("policy", "check", "--files", user=system.OPERATOR)
        assert check.returncode == 1 and "62-systest-typo.yaml:4:5" in check.stderr, check
        journal = system.c.run(["journalctl", "-u", "airlock-approval", "-o", "cat", "--no-pager"]).stdout
        assert "approval.policy.rejected" in journal and "62-systest-typo.yaml:4:5" in journal, journal[-2000:]
    finally:
        system.c.run(["rm", "-f", dropin])
        system.restart_services()


def test_a_typo_in_airlock_yaml_leaves_every_service_up_on_its_last_accepted_copy(system) -> None:
    """Issue 44: each service keeps the airlock.yaml it accepted (its StateDirectory); a refused file is said."""
    try:
        system.set_config("approval:\n  timeout_seconds: 7\n")
        system.restart_services()
        ok = system.airlock("run", "--no-privilege", "--", "/usr/bin/true")  # every service accepts the file
        assert ok.returncode == 0, ok
        system.restart_services()  # as idle exits leave them
        system.set_config("approval:\n  timeout_secs: 7\n")
        r = system.airlock("run", "--no-privilege", "--", "/usr/bin/true")
        said = system.c.run(["journalctl", "-u", "airlock-*", "-n", "40", "--no-pager"]).stdout
        assert r.returncode == 0, f"{r}\n{said}"
        for unit in (*system.SOCKETS, "airlock-intake.service", "airlock-approval.service"):
            assert system.active(unit) == "active", f"{unit}\n{said}"
        status = system.airlock("status", user=system.OPERATOR)
        assert "REFUSED" in status.stdout and "timeout_secs" in status.stdout, status
        assert "intake.config.refused" in system.c.run(["journalctl", "-u", "airlock-intake", "-o", "cat"]).stdout
        check = system.airlock("config", "check", user=system.OPERATOR)
        assert check.returncode == 1 and "timeout_secs" in check.stderr, check
    finally:
        system.restore_config()
        system.restart_services()
