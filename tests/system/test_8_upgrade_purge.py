"""Upgrade keeps local configuration and restarts running services; purge
leaves no airlock process, socket or state behind.  Runs last: it removes
the package the other modules use."""

from __future__ import annotations

import json
import time
import uuid

from test_8_notify import PORT, RECEIVER, SECRET, _wait_for

LOCAL = "\n# local change (systest)\nlog:\n  level: debug\n"
SESSION_RULES = "/etc/airlock/policy.d/50-systest.yaml"  # conftest's: a file the package did not ship
KEY = "/etc/airlock/checkpoint_ed25519_key"
APT_INSTALL = ("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "--no-install-recommends")


def _install(system):
    return system.c.run(
        [*APT_INSTALL, system.deb_inside],
        timeout=300,
    )


def _head(system) -> int:
    return int(system.airlock("audit", "head", user=system.OPERATOR).stdout.split()[0])


def _reinstall(system):
    return system.c.run(
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

    done = _reinstall(system)
    said = done.stdout + done.stderr
    # Issue 44: the postinst names the rule files it did not ship (conftest's), without the alarm of a first install.
    assert f"{SESSION_RULES}" in said and "in force" in said and "WARNING" not in said, said

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


def test_remove_and_install_again_keeps_the_audit_the_key_and_the_local_rules(system) -> None:
    """`apt-get remove` keeps state and configuration; installing again continues the same chain and
    names the rule files the package did not ship (issue 44)."""
    before = _head(system)
    key = system.c.run(["cat", KEY + ".pub"], check=False).stdout  # none without openssh-client (a Recommends)
    removed = system.c.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", "airlock"], timeout=300)
    assert "purge:" not in removed.stdout + removed.stderr, removed  # remove deletes nothing and says nothing of it
    for kept in ("/var/lib/airlock/journal.sqlite", "/var/lib/airlock-approval", SESSION_RULES):
        system.c.run(["test", "-e", kept])
    system.c.run(["test", "!", "-e", "/run/airlock/agent.sock"])

    done = _install(system)
    said = done.stdout + done.stderr
    assert SESSION_RULES in said and "in force" in said and "WARNING" not in said, said
    assert system.c.run(["cat", KEY + ".pub"], check=False).stdout == key  # the same host key, if any
    for socket in system.SOCKETS:
        assert system.active(socket) == "active", socket
    r = system.airlock("run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/true")
    assert r.returncode == 0, r
    assert _head(system) > before  # the same chain, going on
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

    system.c.run(["test", "-d", "/var/lib/airlock-approval"])  # approval's state, there to be purged
    if system.c.run(["test", "-e", KEY], check=False).returncode != 0:
        # The session's root has no openssh-client (a Recommends), so the postinst made no key: a
        # stand-in pair where it would be (the services are on their way out, nothing signs with it).
        system.c.write(KEY, "stand-in\n")
        system.c.write(KEY + ".pub", "ssh-ed25519 AAAA stand-in\n")
    purged = system.c.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "purge", "-y", "airlock"], timeout=300)
    proc.communicate(timeout=60)
    said = purged.stdout + purged.stderr
    # Issue 44: purge says what it removed (the key, and why it matters) and what it kept.
    assert "/var/lib/airlock-approval" in said and f"deleted this host's checkpoint key {KEY}" in said, said
    assert "kept the system users and groups" in said and SESSION_RULES in said, said

    time.sleep(0.5)
    procs = system.c.run(["ps", "-eo", "pid,user,args", "--no-headers"]).stdout
    leftovers = [line for line in procs.splitlines() if "airlock" in line or "sleep 1006" in line]
    assert leftovers == [], procs
    sockets = system.c.run(["sh", "-c", "find /run -name '*.sock' 2>/dev/null | grep airlock || true"]).stdout
    assert sockets == "", sockets
    system.c.run(["test", "!", "-e", "/run/airlock"])
    system.c.run(["test", "!", "-e", "/var/lib/airlock"])
    system.c.run(["test", "!", "-e", "/var/lib/airlock-notify"])  # the relay's cursors went with the journal
    system.c.run(["test", "!", "-e", "/var/lib/airlock-approval"])  # hold, grants, passkeys: the journal's too
    system.c.run(["test", "!", "-e", KEY])
    system.c.run(["test", "-e", SESSION_RULES])  # not the package's: kept, and named above
    system.c.run(["test", "!", "-e", "/etc/airlock/airlock.yaml"])
    units = system.c.run(["systemctl", "list-units", "--all", "--no-legend", "--plain", "airlock*"]).stdout
    assert all(" not-found " in line or " inactive " in line for line in units.splitlines()), units
    state = system.c.run(["dpkg-query", "-W", "-f=${db:Status-Status}", "airlock"], check=False).stdout
    assert state in ("", "not-installed"), state


def test_after_purge_and_reinstall_the_relay_delivers_the_first_pending_request(system) -> None:
    """Issue 28: purge kept the relay's cursor (seq N of the old journal) while the new journal
    started again at 1, so the relay skipped everything until the new journal passed N."""
    done = _install(system)
    # Issue 44: a "fresh" install after the purge comes up with the rule files purge kept: said loudly.
    said = done.stdout + done.stderr
    assert "WARNING: /etc/airlock/policy.d already holds rule files" in said and SESSION_RULES in said, said
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


def _relay(system) -> dict:
    r = system.airlock("--json", "status", user=system.OPERATOR)
    return dict(json.loads(r.stdout)["data"]["relay"])


def _pending(system, reason: str) -> dict:
    proc = system.c.popen(
        ["airlock", "run", "--reason", reason, "--operation-id", f"systest-{reason}", "--", "/usr/bin/hostname"],
        user=system.AGENT,
    )
    message = _wait_for(system, lambda m: m.get("event") == "pending" and m.get("reason") == reason, timeout=30)
    assert system.airlock("deny", message["request_id"], "--reason", "systest", user=system.OPERATOR).returncode == 0
    proc.communicate(timeout=30)
    return message


def test_after_a_reinstall_status_shows_what_the_relay_delivered_and_a_reload_takes_web_url(system) -> None:
    """Issue 44: after a reinstall `status` said the relay had delivered nothing; web.url needed a
    restart of the relay; and once notify.channels was set, approval's wait became 600 s unsaid."""
    receiver = system.c.popen(["timeout", "300", "python3", "-c", RECEIVER])
    channels = (
        "notify:\n  host: systest\n  channels:\n    - "
        f"{{type: webhook, name: hook, url: 'http://127.0.0.1:{PORT}/hook', secret: {SECRET}}}\n"
    )
    system.set_config(channels + "web:\n  url: https://old.example.org\n")
    system.restart_services()
    try:
        system.c.run(["systemctl", "enable", "--now", "airlock-notify.service"], timeout=60)
        first = _pending(system, uuid.uuid4().hex)
        assert first["link"].startswith("https://old.example.org/request?ref="), first
        rid = first["request_id"]
        decided = _wait_for(system, lambda m: m.get("event") == "decided" and m.get("request_id") == rid)
        delivered = decided["seq"]  # the last message there is to deliver
        deadline = time.monotonic() + 30
        while (hook := _relay(system)["channels"][0])["delivered_seq"] != delivered:
            assert time.monotonic() < deadline, (hook, delivered)
            time.sleep(0.5)

        _reinstall(system)
        deadline = time.monotonic() + 30
        while (relay := _relay(system))["state"] != "running":
            assert time.monotonic() < deadline, relay
            time.sleep(0.5)
        assert relay["channels"][0]["delivered_seq"] == delivered, relay
        text = system.airlock("status", user=system.OPERATOR).stdout
        assert f"delivered up to event {delivered}" in text and "nothing delivered" not in text, text
        assert "600 s for an operator: notify.channels is set" in text, text

        pid = system.main_pid("airlock-notify.service")
        system.set_config(channels + "web:\n  url: https://new.example.org\n")
        reloads = ["sh", "-c", "journalctl -u airlock-notify.service -o cat | grep -c notify.reloaded || true"]
        seen = int(system.c.run(reloads).stdout.strip() or 0)
        system.c.run(["systemctl", "reload", "airlock-notify.service"], timeout=60)
        # The reload is a SIGHUP: systemctl returns once it is sent, the relay says when it took it.
        system.c.wait_for(["sh", "-c", f"test $({reloads[2]}) -gt {seen}"], timeout=20)
        second = _pending(system, uuid.uuid4().hex)
        assert second["link"].startswith("https://new.example.org/request?ref="), second
        assert system.main_pid("airlock-notify.service") == pid  # reloaded, not restarted
    finally:
        system.c.run(["systemctl", "disable", "--now", "airlock-notify.service"], check=False)
        receiver.kill()
        system.c.run(["sh", "-c", "kill $(cat /root/hook.pid); rm -f /root/hook.jsonl /root/hook.pid"], check=False)
        system.restore_config()
        system.restart_services()
