"""airlock-web in a real browser (issue 33): headless Chromium with a virtual passkey.

Chromium (Debian's) is driven over the DevTools protocol (tests/cdp.py) with
WebAuthn's virtual authenticator (CTAP2, internal, resident keys, user
verification done), exactly as a person with a phone's passkey would use the
console: enroll from a one-time link, sign in, open a pending root request of
another user's agent, approve it (the agent's command runs as root), and deny
another with a reason (the agent reads it).  The request page is captured at
phone width (390x844); ``AIRLOCK_WEB_SCREENSHOT=docs/web-request.png`` keeps it.

WebAuthn needs a secure context: http://localhost is one, so the stack's web
runs at http://localhost:PORT with the relying party ID ``localhost``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdp import CHROMIUM, Page, chromium

from support import Stack, now_iso, start_stack, stop_stack, wait_pending

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)"),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("useradd") is None,
        reason="a root request from another user's agent needs root (dev up as root) and useradd",
    ),
    pytest.mark.timeout(300),
]

PHONE = (390, 844)


@contextlib.contextmanager
def agent_user() -> Iterator[pwd.struct_passwd]:
    name = f"alweb{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "--remove", "--force", name], capture_output=True)


_AGENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(job["timeout"])
s.connect(job["socket"])
s.sendall(json.dumps(job["request"]).encode() + b"\n")
s.shutdown(socket.SHUT_WR)
buf = b""
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    buf += chunk
print(json.dumps([json.loads(line) for line in buf.splitlines() if line.strip()]))
"""


def ask_as(stack: Stack, user: pwd.struct_passwd, args: dict[str, Any]) -> tuple[str, subprocess.Popen[str]]:
    """One exec request sent by ``user``'s own process (the agent); returns its ID and the process."""
    request_id = f"web-{uuid.uuid4()}"
    request = {"v": 1, "id": request_id, "verb": "exec", "args": {"time": now_iso()} | args}
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", _AGENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        cwd="/",
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"socket": stack.agent, "request": request, "timeout": 120}))
    proc.stdin.close()
    return request_id, proc


def final_reply(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None and proc.stderr is not None
    proc.wait(120)  # the agent's answers are a few lines: the pipe holds them meanwhile
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0, err
    finals = [line for line in json.loads(out) if "event" not in line]
    assert len(finals) == 1, out
    reply: dict[str, Any] = finals[0]
    return reply


@pytest.fixture
def web_stack() -> Iterator[tuple[Stack, pwd.struct_passwd]]:
    with agent_user() as agent:
        runtime = Path(tempfile.mkdtemp(prefix="alweb", dir="/tmp"))
        os.chmod(runtime, 0o755)  # the agent reaches agent.sock; nothing else here is theirs
        config = runtime.parent / f"{runtime.name}.yaml"
        config.write_text(
            f"agents: {{users: [root, {agent.pw_name}], groups: []}}\n"
            "approval: {timeout_seconds: 240}\n"
            "policy: {default: ask, rules: []}\n",
            encoding="utf-8",
        )
        stack = start_stack(runtime, config, web="127.0.0.1:0")
        os.chmod(stack.agent, 0o666)
        try:
            yield stack, agent
        finally:
            stop_stack(stack)
            shutil.rmtree(runtime, ignore_errors=True)
            config.unlink()


def test_enroll_sign_in_approve_and_deny_in_a_browser(
    web_stack: tuple[Stack, pwd.struct_passwd], tmp_path: Path
) -> None:
    stack, agent = web_stack
    assert stack.web is not None and stack.web.startswith("http://localhost:")
    marks = Path(tempfile.mkdtemp(prefix="alweb-root", dir="/tmp"))
    os.chmod(marks, 0o755)  # only root writes here: a mark means the job ran as root
    try:
        asyncio.run(_scenario(stack, agent, tmp_path, marks))
    finally:
        shutil.rmtree(marks, ignore_errors=True)


async def _scenario(stack: Stack, agent: pwd.struct_passwd, tmp_path: Path, marks: Path) -> None:
    web = stack.web
    assert web is not None
    enrolled = stack.native("passkey.enroll", {"account": "root"}, path=stack.operator)
    assert enrolled["ok"], enrolled
    token = enrolled["data"]["token"]
    with chromium(tmp_path / "profile") as port:
        page = await Page.open(port)
        try:
            await page.virtual_authenticator()

            # Enroll from the one-time link: the virtual authenticator makes the passkey.
            await page.navigate(f"{web}/enroll/{token}")
            await page.evaluate("document.querySelector('#enroll button').click()")
            await page.wait_for("document.querySelector('#enroll-status').textContent.includes('enrolled')")

            # Pages need a session: the pending list sends us to sign in first.
            await page.navigate(f"{web}/signin")
            await page.evaluate("document.querySelector('#signin button').click()")
            await page.wait_for(f"location.href === {json.dumps(web + '/')}")
            assert "root" in await page.text()
            # The session cookie as the browser keeps it: script cannot read it, no other site sends it.
            [cookie] = (await page.send("Network.getCookies", urls=[web + "/"]))["cookies"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
            assert not cookie["secure"]  # plain http://localhost here; behind TLS it is Secure (test_sec_web)
            assert await page.evaluate("document.cookie") == ""

            # A root request from the agent waits; the console lists it and shows all of it.
            mark = marks / "approved"
            given = b"hello from the agent\n"
            asked = {"argv": ["touch", str(mark)], "privileged": True, "cwd": str(marks)}
            asked["stdin"] = base64.b64encode(given).decode()
            request_id, proc = ask_as(stack, agent, asked)
            await asyncio.to_thread(wait_pending, stack, request_id, 30)
            await page.navigate(f"{web}/")
            await page.wait_for(f"document.body.innerText.includes({json.dumps(request_id)})")
            await page.evaluate(f"document.querySelector('a[href*={json.dumps(request_id)}]').click()")
            await page.wait_for("document.querySelector('#decide') !== null")
            text = await page.text()
            assert f"touch {mark}" in text and agent.pw_name in text and "privileged" in text
            assert "/usr/bin/touch" in text  # the resolved binary
            # Issue 45: where it runs and what it reads (size, sha256, the first lines), in the page and the statement.
            stdin_line = f"{len(given)} bytes, sha256 {hashlib.sha256(given).hexdigest()}"
            assert str(marks) in text and stdin_line in text and "hello from the agent" in text
            assert f'cwd: "{marks}"' in text and f'stdin: "{stdin_line}"' in text
            png = await page.screenshot(*PHONE, full_page=True)
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and int.from_bytes(png[16:20], "big") == PHONE[0] * 2
            keep = os.environ.get("AIRLOCK_WEB_SCREENSHOT")
            if keep:
                await asyncio.to_thread(Path(keep).write_bytes, png)

            # Approve: the passkey signs this request's statement; approval verifies; the command runs.
            await page.evaluate("document.querySelector('#decide button.allow').click()")
            await page.wait_for("document.querySelector('#decide-status').textContent.includes('Recorded: approved')")
            reply = await asyncio.to_thread(final_reply, proc)
            assert reply["ok"] is True, reply
            assert mark.exists() and mark.stat().st_uid == 0 and stat.S_ISREG(mark.stat().st_mode)

            # Deny with a reason: the agent gets the denial and reads the reason.
            denied_mark = marks / "denied"
            request_id, proc = ask_as(stack, agent, {"argv": ["touch", str(denied_mark)], "privileged": True})
            await asyncio.to_thread(wait_pending, stack, request_id, 30)
            await page.navigate(f"{web}/request?ref={request_id}")
            await page.wait_for("document.querySelector('#decide') !== null")
            await page.evaluate("document.querySelector('#reason').value = 'not during the freeze'")
            await page.evaluate("document.querySelector('#decide button.deny').click()")
            await page.wait_for("document.querySelector('#decide-status').textContent.includes('Recorded: denied')")
            reply = await asyncio.to_thread(final_reply, proc)
            assert reply["ok"] is False and reply["error"]["code"] == "denied", reply
            assert "not during the freeze" in reply["error"]["message"]
            assert not denied_mark.exists()

            # The decisions page shows both, by the passkey's account.
            await page.navigate(f"{web}/decisions")
            text = await page.text()
            assert "allow" in text and "deny" in text
        finally:
            await page.close()
