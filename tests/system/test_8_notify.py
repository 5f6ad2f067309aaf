"""The relay on a booted Debian 12: shipped disabled, enabled by an operator,
a webhook receiver inside the container gets the pending request (signed),
and the relay's own user, an observer, cannot approve."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time

from test_4_approval import _ask

SECRET = "systest-notify-secret-0123456789"
PORT = 8731

# A webhook receiver inside the container: one JSON line per POST (body and signature header).
RECEIVER = f"""
import http.server, json, os
open("/root/hook.pid", "w").write(str(os.getpid()))
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open("/root/hook.jsonl", "a") as f:
            f.write(json.dumps({{"sig": self.headers.get("X-Airlock-Signature"), "body": body.decode()}}) + "\\n")
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", {PORT}), H).serve_forever()
"""


def _received(system) -> list[dict]:
    out = system.c.run(["sh", "-c", "cat /root/hook.jsonl 2>/dev/null || true"]).stdout
    got = []
    for line in out.splitlines():
        item = json.loads(line)
        expected = "sha256=" + hmac.new(SECRET.encode(), item["body"].encode(), hashlib.sha256).hexdigest()
        assert item["sig"] == expected, item
        got.append(json.loads(item["body"]))
    return got


def _wait_for(system, match, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for message in _received(system):
            if match(message):
                return message
        time.sleep(0.3)
    raise AssertionError(f"no matching message: {_received(system)}")


def test_the_relay_ships_disabled_and_within_its_exposure(system) -> None:
    assert system.c.run(["systemctl", "is-enabled", "airlock-notify.service"], check=False).stdout.strip() == "disabled"
    assert system.active("airlock-notify.service") == "inactive"
    r = system.c.run(
        ["systemd-analyze", "verify", "--man=no", "/lib/systemd/system/airlock-notify.service"], check=False
    )
    assert (r.returncode, r.stdout + r.stderr) == (0, ""), r
    out = system.c.run(["systemd-analyze", "security", "--no-pager", "airlock-notify.service"]).stdout
    level = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
    assert level <= 2.0, out


def test_the_relay_reaches_a_webhook_and_its_user_cannot_approve(system) -> None:
    receiver = system.c.popen(["timeout", "300", "python3", "-c", RECEIVER])
    system.set_config(
        "approval:\n  timeout_seconds: 60\n"
        "notify:\n  host: systest\n  channels:\n    - "
        f"{{type: webhook, url: 'http://127.0.0.1:{PORT}/hook', secret: {SECRET}}}\n"
    )
    system.restart_services()
    try:
        system.c.run(["systemctl", "enable", "--now", "airlock-notify.service"], timeout=60)
        assert system.active("airlock-notify.service") == "active"
        proc, request_id = _ask(system, "/usr/bin/hostname")
        message = _wait_for(system, lambda m: m.get("request_id") == request_id and m.get("event") == "pending")
        assert message["decide"].startswith(f"ssh systest airlock approve {request_id} --expect ")
        assert message["user"] == system.AGENT and message["what"] == "/usr/bin/hostname"

        # The relay's own credentials (its unit's user and supplementary group): read yes, approve no.
        as_relay = [
            "setpriv",
            "--reuid=airlock-notify",
            "--regid=airlock-notify",
            "--groups=airlock-admin",
            "--",
            "airlock",
        ]
        assert system.c.run([*as_relay, "pending", "--json"], check=False).returncode == 0
        refused = system.c.run([*as_relay, "approve", request_id, "--reason", "relay"], check=False)
        assert refused.returncode != 0 and "unauthorized" in refused.stdout + refused.stderr, refused

        assert system.airlock("deny", request_id, "--reason", "systest", user=system.OPERATOR).returncode == 0
        proc.communicate(timeout=30)
        decided = _wait_for(system, lambda m: m.get("request_id") == request_id and m.get("event") == "decided")
        assert decided["decision"] == "deny" and decided["by"] == system.OPERATOR
        journal = system.c.run(
            [
                "journalctl",
                "--no-pager",
                "-o",
                "json",
                "-u",
                "airlock-notify.service",
                "MESSAGE_ID=5b0f6f0e2c8a4d7e9a51c3b7d2e86f14",
            ]
        ).stdout
        assert request_id in journal
    finally:
        system.c.run(["systemctl", "disable", "--now", "airlock-notify.service"], check=False)
        receiver.kill()
        system.c.run(["sh", "-c", "kill $(cat /root/hook.pid); rm -f /root/hook.jsonl /root/hook.pid"], check=False)
        system.restore_config()
        system.restart_services()


def _install(system, *extra: str) -> None:
    system.c.run(
        [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            *extra,
            "--no-install-recommends",
            system.deb_inside,
        ],
        timeout=300,
    )


def _asked_and_delivered(system, label: str) -> int:
    """One pending request reaches the receiver; deny it.  Returns its message's seq."""
    proc, request_id = _ask(system, "/usr/bin/hostname")
    try:
        message = _wait_for(
            system, lambda m: m.get("request_id") == request_id and m.get("event") == "pending", timeout=30
        )
    finally:
        system.airlock("deny", request_id, "--reason", label, user=system.OPERATOR)
        proc.communicate(timeout=30)
    return int(message["seq"])


def test_an_enabled_relay_runs_again_after_reinstall_and_after_remove_and_install(system) -> None:
    """Issue 28: debhelper used to stop the relay in preinst on upgrade and never start it again."""
    receiver = system.c.popen(["timeout", "600", "python3", "-c", RECEIVER])
    system.set_config(
        "approval:\n  timeout_seconds: 60\n"
        "notify:\n  host: systest\n  channels:\n    - "
        f"{{type: webhook, name: hook, url: 'http://127.0.0.1:{PORT}/hook', secret: {SECRET}}}\n"
    )
    system.restart_services()
    try:
        system.c.run(["systemctl", "enable", "--now", "airlock-notify.service"], timeout=60)
        _asked_and_delivered(system, "before the reinstall")
        before = system.main_pid("airlock-notify.service")

        _install(system, "--reinstall")
        assert system.active("airlock-notify.service") == "active"
        assert system.main_pid("airlock-notify.service") not in (0, before)  # restarted: the new code runs
        seq = _asked_and_delivered(system, "after the reinstall")

        # What an operator sees: the relay running, the channel's last delivered event, no error.
        deadline = time.monotonic() + 20
        while True:
            r = system.airlock("--json", "status", user=system.OPERATOR)
            assert r.returncode == 0, r
            relay = json.loads(r.stdout)["data"]["relay"]
            hook = (relay.get("channels") or [{}])[0]
            if relay["state"] == "running" and (hook.get("delivered_seq") or 0) >= seq:
                break
            assert time.monotonic() < deadline, relay
            time.sleep(0.5)
        assert hook["name"] == "hook" and hook["last_error"] is None and hook["failing_since"] is None
        text = system.airlock("status", user=system.OPERATOR).stdout
        assert "relay" in text and "running" in text and "delivered up to event" in text, text

        # Removed (not purged) and installed again: still enabled, so it runs again.
        system.c.run(["env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "-r", "airlock"], timeout=300)
        assert system.active("airlock-notify.service") != "active"
        _install(system)
        assert system.c.run(["systemctl", "is-enabled", "airlock-notify.service"]).stdout.strip() == "enabled"
        assert system.active("airlock-notify.service") == "active"
        _asked_and_delivered(system, "after remove and install")
    finally:
        system.c.run(["systemctl", "disable", "--now", "airlock-notify.service"], check=False)
        receiver.kill()
        system.c.run(["sh", "-c", "kill $(cat /root/hook.pid); rm -f /root/hook.jsonl /root/hook.pid"], check=False)
        system.restore_config()
        system.restart_services()
