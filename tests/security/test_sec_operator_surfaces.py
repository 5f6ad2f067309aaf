"""Nothing an agent sends is live where a person looks (issue 28, items 1 and 2).

The relay's copy-paste line put the request ID unquoted into
`ssh HOST airlock approve ID`: an ID of `r1 $(touch /tmp/pwned)` ran on the
operator's machine when pasted.  A backtick closed the Slack code span, and
`<!channel>` or `<http://…|click to approve>` from the agent were then live;
Mattermost rendered the reason as Markdown.

Played by a real throwaway agent against a live stack whose relay delivers to
real receivers (webhook, ntfy, Slack/Mattermost, email on 127.0.0.1):

- the hostile ID is refused at intake (`invalid_request`), journaled nowhere,
  announced nowhere;
- a hostile request that is admitted (shell metacharacters, backticks,
  `<!channel>`, links, Markdown in argv, reason, session and host; ANSI, bidi
  and newlines in a file's content) reaches every channel and the console
  (`pending`, `show`, `events`, the `watch` screen) as inert bytes;
- every approve/deny line a channel carries, pasted into `sh -c` (with `ssh`
  standing in for the remote shell), runs only `airlock`, and (the control)
  still names the request.
"""

from __future__ import annotations

import base64
import email.message
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from secsupport import agent_request, final, needs_root, red_stack, replies, throwaway_user

from airlock.cli import main as cli_main
from airlock.cli.watch import describe
from airlock.common.render import Style
from notify_receivers import HttpReceiver, MailReceiver, Post

from support import wait_pending

pytestmark = needs_root

SECRET = "surfaces-test-secret-0123456789"

# What the agent may send (intake refuses control and bidi characters in these fields, so they
# carry everything else a shell or a chat service could act on).
LINKS = "<!channel> <!here> <@U0123> <http://evil.example/x|click to approve> [approve](http://evil.example/y)"
REASON = f"routine `rm -rf /` $(touch {{mark}}) {LINKS} @channel @all *now* _x_ ~y~ &amp; &lt;b&gt; # head"
# A file's content is the agent's to choose, byte for byte: ANSI, OSC 8 links, bidi, zero-width, newlines.
CONTENT = (
    "line 1\n\x1b[2J\x1b[31mapproved\x1b[0m\n\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\nabc\u202edcba\u200b\r\n"
)


def _config(http: HttpReceiver, mail: MailReceiver, agent: str) -> str:
    return (
        f"agents: {{users: [{agent}]}}\n"
        "approval: {timeout_seconds: 120}\n"
        "notify:\n  host: testhost\n  poll_seconds: 0.2\n  backoff_max_seconds: 2\n  channels:\n"
        f"    - {{type: webhook, name: hook, url: '{http.url('/hook')}', secret: {SECRET}}}\n"
        f"    - {{type: ntfy, name: ntfy, url: '{http.url('/ntfy')}'}}\n"
        f"    - {{type: slack, name: chat, url: '{http.url('/chat')}'}}\n"
        f"    - {{type: email, name: mail, host: 127.0.0.1, port: {mail.port}, from: a@test, to: [ops@test]}}\n"
    )


def _inert(text: str, where: str) -> None:
    """Printable characters and newlines only: nothing a terminal or a viewer acts on or hides."""
    bad = sorted({f"U+{ord(c):04X}" for c in text if c != "\n" and not c.isprintable()})
    assert not bad, f"{where}: {bad}"
    for ch in "\u202e\u2066\u200b\x1b":
        assert ch not in text, where


def _paste(line: str, tmp: Path, request_id: str, verb: str) -> None:
    """Run a line from a message as an operator's shell would; only `airlock` may run, on this request."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp / "argv"
    record.unlink(missing_ok=True)
    (bin_dir / "ssh").write_text('#!/bin/sh\nshift\nexec /bin/sh -c "$*"\n')  # the remote side: a shell reads the words
    (bin_dir / "airlock").write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done > {record}\n')
    for name in ("ssh", "airlock"):
        (bin_dir / name).chmod(0o755)
    subprocess.run(["/bin/sh", "-c", line], cwd=tmp, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, check=True, timeout=10)
    argv = [a.decode() for a in record.read_bytes().split(b"\0")[:-1]]
    ns = cli_main.parser().parse_args(argv)
    assert ns.verb == verb and ns.id == request_id, (line, argv)


def test_a_hostile_request_is_inert_in_every_channel_and_on_the_console(tmp_path: Path) -> None:
    http, mail = HttpReceiver(), MailReceiver()
    os.chmod(tmp_path, 0o755)
    pwned_by_id, pwned = tmp_path / "pwned-by-id", tmp_path / "pwned"
    try:
        with throwaway_user("alsurf") as agent, red_stack(_config(http, mail, agent.pw_name)) as stack:
            # 1. The ID from the issue is refused at the door, and goes nowhere.
            bad_id = f"r1 $(touch {pwned_by_id})"
            reply = final(replies(agent_request(stack.agent, agent, "exec", _hostile_exec(pwned), request_id=bad_id)))
            assert reply["ok"] is False and reply["error"]["code"] == "invalid_request", reply
            assert reply["id"] is None and reply["error"]["details"]["field"] == "id"
            assert not any(str(pwned_by_id) in json.dumps(row) for row in stack.journal_rows())

            # 2. An admitted hostile request: a command and a file write, both waiting for an operator.
            rid, fid = f"sec-{uuid.uuid4()}", f"secf-{uuid.uuid4()}"
            cmd = agent_request(stack.agent, agent, "exec", _hostile_exec(pwned), request_id=rid, timeout=120)
            target = Path(agent.pw_dir) / "notes.txt"
            write = {
                "path": str(target),
                "privileged": True,
                "content": base64.b64encode(CONTENT.encode()).decode(),
                "reason": "notes",
            }
            files = agent_request(stack.agent, agent, "files_write", write, request_id=fid, timeout=120)
            wait_pending(stack, rid)
            wait_pending(stack, fid)

            hook = _signed(http.wait("/hook", lambda p: p.json()["request_id"] == rid))
            ntfy = http.wait("/ntfy", lambda p: rid.encode() in p.body)
            chat = http.wait("/chat", lambda p: rid in p.json()["text"])
            _, mailed = mail.wait(lambda m: rid in m.get_content())
            http.wait("/chat", lambda p: fid in p.json()["text"])

            # The agent's text did reach the operator, as text (the reason's links are there, inert).
            assert "click to approve" in hook["reason"] and "$(touch" in hook["what"]

            # Slack and Mattermost: no live sequence anywhere markup is read; link previews off.
            for post in http.on("/chat"):
                body = post.json()
                assert body["unfurl_links"] is False and body["unfurl_media"] is False
                marked = [body["text"]] + [b["text"]["text"] for b in body["blocks"] if b["text"]["type"] == "mrkdwn"]
                for text in marked:
                    assert "<" not in text and ">" not in text, text
                    _inert(text, "chat markup")
                # Mattermost renders `text` as Markdown: it is one code block nothing inside can close.
                assert body["text"].startswith("```\n") and body["text"].endswith("\n```")
                assert body["text"].count("`") == 6, body["text"]
                for block in body["blocks"]:
                    _inert(block["text"]["text"], "chat block")
            assert "&lt;!channel&gt;" in chat.json()["text"]
            # ntfy: plain text (markdown never requested), no click or action headers.
            assert not {"markdown", "x-markdown", "click", "actions", "attach"} & set(ntfy.headers)
            _inert(ntfy.body.decode(), "ntfy body")
            # Email: one text/plain part.
            assert isinstance(mailed, email.message.EmailMessage)
            assert mailed.get_content_type() == "text/plain" and not mailed.is_multipart()
            _inert(mailed.get_content().replace("\r\n", "\n"), "mail body")  # SMTP lines end in CRLF
            # Webhook: JSON, signed; its strings are the same sanitised text.
            for post in http.on("/hook"):
                _inert(json.dumps(_signed(post), ensure_ascii=False), "webhook body")

            # The lines to paste run only `airlock`, and still name the request.
            text_lines = [ln for ln in mailed.get_content().splitlines() if ln.startswith(("approve: ", "deny: "))]
            assert len(text_lines) == 2, mailed.get_content()
            for line, verb in (
                (hook["decide"], "approve"),
                (hook["deny"], "deny"),
                (text_lines[0].removeprefix("approve: "), "approve"),
                (text_lines[1].removeprefix("deny: "), "deny"),
            ):
                _paste(line, tmp_path, rid, verb)
            assert hook["decide"].startswith(f"ssh testhost airlock approve {rid} --expect ")  # issue 27's binding

            # The console: every screen an operator reads is inert too.
            for argv in (("pending",), ("show", rid), ("show", fid), ("events", "--tail", "60")):
                done = stack.cli(*argv)
                assert done.returncode == 0, (argv, done.stderr)
                _inert(done.stdout + done.stderr, " ".join(argv))
            pending = stack.native("pending", path=stack.operator)["data"]["pending"]
            assert {p["request_id"] for p in pending} >= {rid, fid}
            for item in pending:
                _inert(describe(item, Style(False), 1, len(pending)), "watch")
            shown = stack.cli("pending").stdout
            assert "\\x1b" in shown and "\\u202e" in shown  # the file's escapes are shown, visibly

            for request_id in (rid, fid):
                assert stack.native("deny", {"id": request_id, "reason": "test"}, path=stack.operator)["ok"]
            assert final(replies(cmd))["error"]["code"] == "denied"
            assert final(replies(files))["error"]["code"] == "denied"
            assert not target.exists()
        assert not any(str(pwned_by_id) in p.body.decode(errors="replace") for p in http.posts)
        assert not pwned.exists() and not pwned_by_id.exists()
    finally:
        http.down()
        mail.stop()


def _hostile_exec(mark: Path) -> dict[str, Any]:
    return {
        "argv": ["/bin/echo", "`id`", f"$(touch {mark})", "<!here>", "<http://evil.example|click to approve>", "'"],
        "privileged": True,
        "reason": REASON.format(mark=mark),
        "session": "<!channel> `whoami`",
        "host": "$(reboot)",
    }


def _signed(post: Post) -> dict[str, Any]:
    import hashlib
    import hmac

    expected = "sha256=" + hmac.new(SECRET.encode(), post.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(post.headers["x-airlock-signature"], expected)
    body: dict[str, Any] = post.json()
    return body
