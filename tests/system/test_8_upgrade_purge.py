"""Upgrade keeps local configuration and restarts running services; purge
leaves no airlock process, socket or state behind.  Runs last: it removes
the package the other modules use."""

from __future__ import annotations

import time
import uuid

from test_8_notify import PORT, RECEIVER, SECRET, _wait_for

LOCAL = "\n# local change (systest)\nlog:\n  level: debug\n"


def _reinstall(system) -> None:
    system.c.run(
        [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "--reinstall",
            "--no-install-recommends",
            system.deb_inside,
        ],
        timeout=300,
    )


def test_the_session_left_no_crash_in_the_journal(system) -> None:
    # Everything before this module (kills and restarts included) ran without
    # an unhandled exception, a watchdog kill or a start-rate-limit failure.
    log = system.c.run(["journalctl", "--no-pager", "-o", "cat", "-u", "airlock*"]).stdout
    for bad in ("Traceback", "Watchdog timeout", "Start request repeated too quickly", "internal error"):
        assert bad not in log, [line for line in log.splitlines() if bad in line][:10]


def test_upgrade_keeps_local_config_and_restarts_running_services(system) -> None:
    original = system.c.run(["cat", "/etc/airlock/airlock.yaml"]).stdout
    system.c.write("/etc/airlock/airlock.yaml", original + LOCAL)
    assert (
        system.airlock(
            "run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/true"
        ).returncode
        == 0
    )
    running = {s: system.main_pid(s) for s in system.SERVICES}
    assert all(running.values()), running

    _reinstall(system)

    assert system.c.run(["cat", "/etc/airlock/airlock.yaml"]).stdout == original + LOCAL
    assert "level: debug" in system.c.run(["airlock", "config", "show"]).stdout
    for service, pid in running.items():
        # restarted (new process) or, if it restarts lazily, not the old one
        assert system.main_pid(service) != pid, service
    for socket in system.SOCKETS:
        assert system.c.run(["systemctl", "is-enabled", socket]).stdout.strip() == "enabled"
        assert system.active(socket) == "active", socket
    r = system.airlock(
        "run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/id", "-un"
    )
    assert (r.returncode, r.stdout.strip()) == (0, system.AGENT), r
    system.audit_verify()


def test_purge_leaves_no_process_no_socket_no_state(system) -> None:
    # A job is running when the package goes.
    proc = system.c.popen(
        [
            "airlock",
            "run",
            "--no-privilege",
            "--operation-id",
            f"systest-{uuid.uuid4().hex}",
            "--",
            "/usr/bin/sleep",
            "1006",
        ],
        user=system.AGENT,
    )
    system.c.wait_for(["pgrep", "-f", "sleep 1006"], timeout=20)

    system.c.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "purge", "-y", "airlock"], timeout=300)
    proc.communicate(timeout=60)

    time.sleep(0.5)
    procs = system.c.run(["ps", "-eo", "pid,user,args", "--no-headers"]).stdout
    leftovers = [line for line in procs.splitlines() if "airlock" in line or "sleep 1006" in line]
    assert leftovers == [], procs
    sockets = system.c.run(["sh", "-c", "find /run -name '*.sock' 2>/dev/null | grep airlock || true"]).stdout
    assert sockets == "", sockets
    system.c.run(["test", "!", "-e", "/run/airlock"])
    system.c.run(["test", "!", "-e", "/var/lib/airlock"])
    system.c.run(["test", "!", "-e", "/var/lib/airlock-notify"])  # the relay's cursors went with the journal
    system.c.run(["test", "!", "-e", "/etc/airlock/airlock.yaml"])
    units = system.c.run(["systemctl", "list-units", "--all", "--no-legend", "--plain", "airlock*"]).stdout
    assert all(" not-found " in line or " inactive " in line for line in units.splitlines()), units
    state = system.c.run(["dpkg-query", "-W", "-f=${db:Status-Status}", "airlock"], check=False).stdout
    assert state in ("", "not-installed"), state


def test_after_purge_and_reinstall_the_relay_delivers_the_first_pending_request(system) -> None:
    """Issue 28: purge kept the relay's cursor (seq N of the old journal) while the new journal
    started again at 1, so the relay skipped everything until the new journal passed N."""
    system.c.run(
        [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "--no-install-recommends",
            system.deb_inside,
        ],
        timeout=300,
    )
    receiver = system.c.popen(["timeout", "300", "python3", "-c", RECEIVER])
    system.set_config(
        "notify:\n  host: systest\n  channels:\n    - "
        f"{{type: webhook, name: hook, url: 'http://127.0.0.1:{PORT}/hook', secret: {SECRET}}}\n"
    )
    system.restart_services()
    try:
        system.c.run(["systemctl", "enable", "--now", "airlock-notify.service"], timeout=60)
        marker = uuid.uuid4().hex
        proc = system.c.popen(
            ["airlock", "run", "--reason", marker, "--operation-id", f"systest-{marker}", "--", "/usr/bin/hostname"],
            user=system.AGENT,
        )
        message = _wait_for(system, lambda m: m.get("event") == "pending" and m.get("reason") == marker, timeout=30)
        assert (
            system.airlock("deny", message["request_id"], "--reason", "systest", user=system.OPERATOR).returncode == 0
        )
        proc.communicate(timeout=30)
    finally:
        system.c.run(["systemctl", "disable", "--now", "airlock-notify.service"], check=False)
        receiver.kill()
        system.c.run(["sh", "-c", "kill $(cat /root/hook.pid); rm -f /root/hook.jsonl /root/hook.pid"], check=False)
