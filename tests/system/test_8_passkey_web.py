"""airlock-web on a booted Debian 12 (issue 33): the package ships it disabled; an
operator enables its socket and the sign-in page answers on 127.0.0.1:8787,
served by the airlock-web user inside its sandbox, which reaches operator.sock."""

from __future__ import annotations

import json
import re

PORT = 8787
URL = f"http://localhost:{PORT}"

# An HTTP client inside the container (the stdlib: minbase has no curl).
FETCH = r"""
import json, sys, urllib.error, urllib.request
method, url, body = sys.argv[1], sys.argv[2], sys.argv[3]
headers = {"Origin": "http://localhost:8787"}
data = None
if method == "POST":
    data, headers["Content-Type"] = body.encode(), "application/json"
class Keep(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None
try:
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    r = urllib.request.build_opener(Keep).open(request, timeout=30)
    status, head, text = r.status, dict(r.headers), r.read().decode()
except urllib.error.HTTPError as e:
    status, head, text = e.code, dict(e.headers), e.read().decode()
print(json.dumps({"status": status, "headers": head, "body": text}))
"""


def _fetch(system, method: str, path: str, body: str = "", host: str = "127.0.0.1") -> dict:
    out = system.c.run(["python3", "-c", FETCH, method, f"http://{host}:{PORT}{path}", body], timeout=60).stdout
    reply: dict = json.loads(out)
    return reply


def test_the_web_console_ships_disabled_and_within_its_exposure(system) -> None:
    for unit in ("airlock-web.socket", "airlock-web.service"):
        state = system.c.run(["systemctl", "is-enabled", unit], check=False).stdout.strip()
        assert state in ("disabled", "static"), (unit, state)
        assert system.active(unit) == "inactive"
    assert system.c.run(["systemctl", "is-enabled", "airlock-web.socket"], check=False).stdout.strip() == "disabled"
    listening = system.c.run(["sh", "-c", f"ss -ltn 2>/dev/null | grep -c ':{PORT} ' || true"], check=False)
    assert listening.stdout.strip() in ("", "0")
    for unit in ("airlock-web.socket", "airlock-web.service"):
        r = system.c.run(["systemd-analyze", "verify", "--man=no", f"/lib/systemd/system/{unit}"], check=False)
        assert (r.returncode, r.stdout + r.stderr) == (0, ""), r
    out = system.c.run(["systemd-analyze", "security", "--no-pager", "airlock-web.service"]).stdout
    level = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
    assert level <= 1.5, out
    assert system.c.run(["id", "-u", "airlock-web"], check=False).returncode == 0


def test_enabling_the_socket_serves_the_sign_in_page_on_localhost(system) -> None:
    system.set_config(f"web:\n  url: {URL}\n")
    system.restart_services()
    try:
        system.c.run(["systemctl", "enable", "--now", "airlock-web.socket"], timeout=60)
        page = _fetch(system, "GET", "/signin")
        assert page["status"] == 200 and "Sign in with passkey" in page["body"], page
        assert page["headers"]["Content-Security-Policy"].startswith("default-src 'none'")
        assert page["headers"]["X-Frame-Options"] == "DENY"
        # localhost is both loopback addresses: the socket unit holds [::1]:8787 too, so no local user
        # can listen there and be the console's origin (issue 46).
        assert "Sign in with passkey" in _fetch(system, "GET", "/signin", host="[::1]")["body"]
        # Started on the first connection, as its own user, in its sandbox.
        assert system.active("airlock-web.service") == "active"
        pid = system.main_pid("airlock-web.service")
        owner = system.c.run(["ps", "-o", "user=", "-p", str(pid)]).stdout.strip()
        assert owner == "airlock-web"
        # Every other page needs a session.
        assert _fetch(system, "GET", "/")["status"] == 303
        # It reaches operator.sock from its sandbox: approval answers the sign-in step with options.
        begun = _fetch(system, "POST", "/signin/begin", "{}")
        assert begun["status"] == 200, begun
        data = json.loads(begun["body"])
        assert data["ok"] is True and data["options"]["rpId"] == "localhost" and data["challenge_id"]
        # ... as an observer: its credentials can read, never approve.
        as_web = ["setpriv", "--reuid=airlock-web", "--regid=airlock-admin", "--clear-groups", "--", "airlock"]
        assert system.c.run([*as_web, "pending", "--json"], check=False).returncode == 0
        refused = system.c.run([*as_web, "hold", "--reason", "web"], check=False)
        assert refused.returncode != 0 and "unauthorized" in refused.stdout + refused.stderr, refused
        # Started as an operator's account instead of web.user, it refuses to run at all (78).
        as_operator = ["setpriv", f"--reuid={system.OPERATOR}", f"--regid={system.OPERATOR}", "--init-groups"]
        wrong = system.c.run([*as_operator, "/usr/libexec/airlock/airlock-web"], check=False, timeout=60)
        assert wrong.returncode == 78 and "may decide" in wrong.stderr, wrong
    finally:
        system.c.run(["systemctl", "disable", "--now", "airlock-web.socket"], check=False)
        system.c.run(["systemctl", "stop", "airlock-web.service"], check=False)
        system.restore_config()
        system.restart_services()
