"""What the ticket binds is shown (issue 45, item 1): a root job's stdin and cwd reach every person's eyes.

Both are in the spec's digest, so the ticket binds them; before this, no
surface showed either.  ``/usr/sbin/chpasswd`` as root with stdin
``root:…`` read as a harmless command, and ``chown -R agent .`` with cwd
``/etc`` as a chown in some directory.  Played by a throwaway agent against
a live stack whose relay posts to a real webhook receiver:

- `pending`, `show`, the `watch` screen, the statement a key or passkey signs
  and the relay's message show the cwd, and stdin by size and sha256; the
  operator's surfaces also show its first lines, escaped; `show ID --stdin`
  gives operators the whole of it;
- stdin's bytes (a password here) are in no journal record and no relay
  message: only its size and sha256;
- an observer gets stdin's size and sha256 only, and `show --stdin` refuses it;
- the control: a plain root request shows the default cwd and "stdin: none",
  and no excerpt.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
from typing import Any

from secsupport import agent_request, final, needs_root, red_stack, replies, throwaway_user
from test_sec_observers import operator_call

from airlock.cli.watch import describe
from airlock.common.render import Style
from notify_receivers import HttpReceiver

from support import wait_pending

pytestmark = needs_root

PASSWORD = "hunter2-issue45-secret"
STDIN = f"root:{PASSWORD}\n\x1b[2Jroot:ok\n".encode()


def _config(http: HttpReceiver, agent: str, observer: str) -> str:
    return (
        f"agents: {{users: [{agent}]}}\n"
        f"operators:\n  observers: {{users: [{observer}], groups: []}}\n"
        "approval: {timeout_seconds: 120}\n"
        "notify:\n  host: testhost\n  poll_seconds: 0.2\n  channels:\n"
        f"    - {{type: webhook, name: hook, url: '{http.url('/hook')}', secret: shown-test-secret-0123456789}}\n"
    )


def test_stdin_and_cwd_of_a_root_job_are_shown_everywhere_a_person_decides() -> None:
    http = HttpReceiver()
    digest, size = hashlib.sha256(STDIN).hexdigest(), len(STDIN)
    try:
        with (
            throwaway_user("alshow") as agent,
            throwaway_user("alsobs") as observer,
            red_stack(_config(http, agent.pw_name, observer.pw_name)) as stack,
        ):
            chpasswd, chown, plain = (f"sec-{name}-{uuid.uuid4().hex[:8]}" for name in ("pw", "chown", "plain"))
            asks: dict[str, dict[str, Any]] = {
                chpasswd: {"argv": ["/usr/sbin/chpasswd"], "stdin": base64.b64encode(STDIN).decode()},
                chown: {"argv": ["/usr/bin/chown", "-R", agent.pw_name, "."], "cwd": "/etc"},
                plain: {"argv": ["/usr/bin/id", "-u"]},  # the control
            }
            procs = {
                rid: agent_request(
                    stack.agent, agent, "exec", args | {"privileged": True, "reason": "routine"}, request_id=rid
                )
                for rid, args in asks.items()
            }
            for rid in asks:
                wait_pending(stack, rid)

            pending = {p["request_id"]: p for p in stack.native("pending", path=stack.operator)["data"]["pending"]}
            listed = stack.cli("pending").stdout
            screens = {rid: describe(pending[rid], Style(False), 1, 3) for rid in asks}
            shows = {rid: stack.cli("show", rid).stdout for rid in asks}
            statements = {rid: pending[rid]["statement"] for rid in asks}
            hooks = {rid: http.wait("/hook", lambda p, rid=rid: p.json()["request_id"] == rid).json() for rid in asks}

            stdin_line = f"{size} bytes, sha256 {digest}"
            # chpasswd: its stdin by size and digest everywhere, its first line (escaped) to operators.
            assert f"{chpasswd} stdin: {stdin_line}" in listed
            assert f"{chpasswd} |: root:{PASSWORD}" in listed and "\\x1b[2J" in listed and "\x1b" not in listed
            for text in (screens[chpasswd], shows[chpasswd]):
                assert stdin_line in text and f"root:{PASSWORD}" in text and "\x1b" not in text, text
            assert f'stdin: "{stdin_line}"' in statements[chpasswd]
            assert hooks[chpasswd]["stdin"] == stdin_line and stdin_line in hooks[chpasswd]["text"]
            assert 'cwd: "/ (default for root)"' in statements[chpasswd]

            # chown -R in /etc: the cwd everywhere.
            assert f"{chown} cwd: /etc" in listed
            for text in (screens[chown], shows[chown]):
                assert "/etc" in text and "stdin" in text, text
            assert 'cwd: "/etc"' in statements[chown] and 'stdin: "none"' in statements[chown]
            assert hooks[chown]["cwd"] == "/etc" and "cwd: /etc" in hooks[chown]["text"]

            # The whole stdin, for operators only, byte for byte into a pipe.
            whole = stack.cli("show", chpasswd, "--stdin")
            assert whole.returncode == 0, whole.stderr
            assert whole.stdout.encode() == STDIN and digest in whole.stderr

            # An observer reads the size and digest, never the bytes, and cannot ask for them.
            os.chmod(stack.operator, 0o666)  # the socket unit's mode is not what is tested here
            seen = operator_call(stack.operator, observer, "pending")["data"]["pending"]
            [watched] = [p for p in seen if p["request_id"] == chpasswd]
            assert watched["stdin"] == {"bytes": size, "sha256": digest} and PASSWORD not in json.dumps(seen)
            refused = operator_call(stack.operator, observer, "show", {"ref": chpasswd, "stdin": True})
            assert refused["ok"] is False and refused["error"]["code"] == "unauthorized", refused

            # The control: a plain root request says where it runs and that it reads nothing.
            assert f"{plain} cwd: / (default for root)" in listed and f"{plain} stdin: none" in listed
            assert f"{plain} |" not in listed
            assert 'stdin: "none"' in statements[plain] and hooks[plain]["stdin"] == "none"

            for rid in asks:
                assert stack.native("deny", {"id": rid, "reason": "test"}, path=stack.operator)["ok"]
                assert final(replies(procs[rid]))["error"]["code"] == "denied"

            # stdin's bytes reached no record and no relay message: its size and digest did.
            rows = json.dumps(stack.journal_rows())
            assert PASSWORD not in rows and base64.b64encode(STDIN).decode() not in rows
            assert digest in rows
            assert not any(PASSWORD in post.body.decode(errors="replace") for post in http.posts)
            # Settled: the bytes are gone with the pending request; show says so.
            gone = stack.cli("show", chpasswd, "--stdin")
            assert gone.returncode != 0 and "only while a request is pending" in gone.stderr
    finally:
        http.down()
