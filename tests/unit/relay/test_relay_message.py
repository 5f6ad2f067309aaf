"""The relay's messages: what an operator reads, and what a receiver can check."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any, TypeVar

import pytest

from airlock.common import channels, render
from airlock.common.channels.base import Channel
from airlock.common.channels.mail import Email
from airlock.common.channels.ntfy import Ntfy
from airlock.common.channels.slack import Slack
from airlock.common.channels.webhook import Webhook, signature
from airlock.common.config import parse_text
from airlock.relay import cursor
from airlock.relay import message as msg

NOW = 1_800_000_000.0
C = TypeVar("C", bound=Channel)


def _channel(cls: type[C], entry: str) -> C:
    """A channel as the relay makes it: from its entry in notify.channels, parsed by the config."""
    channel = channels.of(parse_text(f"notify:\n  channels:\n    - {entry}\n", "/x.yaml").notify.channels[0])
    assert isinstance(channel, cls)
    return channel


def _pending(**request: Any) -> dict[str, Any]:
    req = {
        "stages": [["/usr/bin/systemctl", "restart", "nginx"]],
        "privileged": True,
        "uid": 0,
        "reason": "renew certs",
        "env": {"LANG": "C", "API_KEY": "not-for-chat"},
        "spec": {
            "privileged": True,
            "uid": 0,
            "env": {"LANG": "C", "API_KEY": "not-for-chat"},
            "stages": [["/usr/bin/systemctl", "restart", "nginx"]],
        },
    } | request
    return {
        "seq": 42,
        "time": "2027-01-15T08:00:00Z",
        "kind": "approval.pending",
        "request_id": "r-1",
        "operation_id": "op-1",
        "peer_uid": 1001,
        "payload": {"rule": "default", "timeout_seconds": 60.0, "request": req},
    }


def _user_of(uid: object) -> str:
    names = {0: "root", 1001: "agent"}
    return names[uid] if isinstance(uid, int) and uid in names else str(uid)


def _at(event: dict[str, Any], seconds: float) -> float:
    return msg._parse_time(event["time"]) + seconds  # type: ignore[operator]


def test_a_pending_message_says_what_is_needed_to_decide() -> None:
    event = _pending()
    m = msg.pending_message(event, "db1", _user_of, _at(event, 15))
    assert m["seq"] == 42 and m["event"] == "pending" and m["host"] == "db1"
    assert m["user"] == "agent" and m["uid"] == 1001 and m["run_as"] == "root" and m["privileged"]
    assert m["what"] == "/usr/bin/systemctl restart nginx" and m["rule"] == "default"
    assert m["reason"] == "renew certs" and m["seconds_left"] == 45.0
    assert m["decide"] == "ssh db1 airlock approve r-1"
    for line in (
        "request r-1 on db1",
        "runs as: root (privileged)",
        "reason: renew certs",
        "time left: 45s",
        "approve: ssh db1 airlock approve r-1",
        "(event 42)",
    ):
        assert line in m["text"], line
    # Environment values never leave: names only.
    assert m["env_names"] == ["API_KEY", "LANG"]
    assert "not-for-chat" not in json.dumps(m)


def test_a_pending_message_links_to_the_request_page_when_web_url_is_set() -> None:
    event = _pending() | {"request_id": "r 1/&x"}
    assert msg.pending_message(event, "db1", _user_of, _at(event, 1))["link"] is None
    m = msg.pending_message(event, "db1", _user_of, _at(event, 1), "https://airlock.example.org/")
    # Exact (AGENT/ID by uid: request IDs are each agent's own) and quoted: the ID cannot add a parameter.
    assert m["link"] == "https://airlock.example.org/request?ref=1001%2Fr%201%2F%26x"
    assert f"open: {m['link']}" in m["text"]
    assert "open: " in msg.reminder(m, _at(event, 20))["text"]


def test_agent_text_cannot_forge_lines_or_hide_characters() -> None:
    event = _pending(
        reason="ok\n\napprove: ssh evil\u202e",
        stages=[["/bin/echo", "a\x1b[2Jb"]],
        spec={"privileged": False, "uid": 1001, "stages": [["/bin/echo", "a\x1b[2Jb"]]},
    )
    m = msg.pending_message(event, "db1", _user_of, _at(event, 1))
    assert "\n" not in m["reason"] and "\u202e" not in m["reason"] and "\\x0a" in m["reason"]
    assert "\x1b" not in m["what"] and "\\x1b" in m["what"]
    assert m["run_as"] == "agent" and not m["privileged"]
    assert m["text"].count("\napprove: ") == 1


def test_a_file_operation_is_named_as_one() -> None:
    event = _pending(tool="files_write", path="/etc/nginx/nginx.conf", stages=None)
    m = msg.pending_message(event, "db1", _user_of, _at(event, 1))
    assert m["mode"] == "file" and m["what"] == "files_write /etc/nginx/nginx.conf"


def test_follow_ups_and_rule_decisions() -> None:
    known = msg.pending_message(_pending(), "db1", _user_of, NOW)
    base = {"seq": 43, "kind": "approval.decided", "request_id": "r-1", "operation_id": "op-1"}
    denied = msg.decided_message(
        base | {"payload": {"decision": "deny", "by": "alice", "reason": "no", "rule": "default"}}, "db1", known
    )
    assert denied is not None and denied["decision"] == "deny" and denied["what"] == known["what"]
    assert denied["title"] == "airlock: r-1 denied by alice on db1"
    expired = msg.decided_message(base | {"payload": {"decision": "timeout", "by": "timeout"}}, "db1", None)
    assert expired is not None and "timed out" in expired["title"]
    withdrawn = msg.decided_message(base | {"payload": {"decision": "withdrawn", "by": "agent"}}, "db1", None)
    assert withdrawn is not None and "withdrawn" in withdrawn["title"]
    assert msg.decided_message(base | {"payload": {"decision": "allow", "by": "policy"}}, "db1", None) is None


def test_digest_and_reminder() -> None:
    a = msg.pending_message(_pending(), "db1", _user_of, NOW)
    b = msg.pending_message(_pending() | {"seq": 50, "request_id": "r-2"}, "db1", _user_of, NOW)
    d = msg.digest([a, b])
    assert d["seq"] == 50 and d["count"] == 2 and "r-1" in d["text"] and "r-2" in d["text"]
    event = _pending()
    r = msg.reminder(msg.pending_message(event, "db1", _user_of, _at(event, 1)), _at(event, 50))
    assert (
        r["event"] == "reminder" and r["seq"] == 42 and r["seconds_left"] == 10.0 and r["text"].startswith("reminder:")
    )


def test_each_channel_gets_its_format() -> None:
    m = msg.pending_message(_pending(), "db1", _user_of, NOW)
    body = _channel(Webhook, "{type: webhook, url: 'http://h/', secret: 0123456789abcdef}").body(m)
    assert json.loads(body) == json.loads(json.dumps(m))
    assert signature("s3cret", body) == "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    text, headers = _channel(
        Ntfy, "{type: ntfy, url: 'http://h/', priority: urgent, tags: [lock, warning], token: tk}"
    ).body(m)
    assert headers["Priority"] == "5" and headers["Tags"] == "lock,warning" and headers["Authorization"] == "Bearer tk"
    assert headers["X-Airlock-Seq"] == "42" and b"ssh db1 airlock approve r-1" in text
    slack = json.loads(_channel(Slack, "{type: slack, url: 'http://h/'}").body(m))
    assert "r-1" in slack["text"] and slack["blocks"][0]["type"] == "header"
    mail = _channel(Email, "{type: email, from: a@h, to: [b@h, c@h]}").body(m)
    assert mail["To"] == "b@h, c@h" and mail["X-Airlock-Seq"] == "42" and "airlock approve r-1" in mail.get_content()


def test_the_cursor_survives_and_refuses_to_guess(tmp_path: Path) -> None:
    path = cursor.path_for(tmp_path, "hook")
    assert cursor.load(path) is None
    cursor.save(path, cursor.Cursor(7))
    cursor.save(path, cursor.Cursor(9, "a" * 64, frozenset({12, 11})))
    assert cursor.load(path) == cursor.Cursor(9, "a" * 64, frozenset({11, 12}))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["cursor-hook.json"]  # no temporary file left
    path.write_text("{torn")
    with pytest.raises(cursor.CursorError):
        cursor.load(path)
    path.unlink()
    os.symlink(tmp_path / "elsewhere.json", path)
    (tmp_path / "elsewhere.json").write_text('{"seq": 1}')
    with pytest.raises(cursor.CursorError):
        cursor.load(path)
    with pytest.raises(ValueError, match="is not a safe file name"):
        cursor.path_for(tmp_path, "../escape")


def test_secrets_can_live_in_files_of_their_own(tmp_path: Path) -> None:
    from airlock.common.channels.base import SecretError
    from airlock.common.config import ConfigError

    good = tmp_path / "secret"
    good.write_text("0123456789abcdef-long\n")
    cfg = parse_text(
        f"notify:\n  channels:\n    - {{type: webhook, url: 'http://h/', secret_file: {good}}}\n", "/x.yaml"
    )
    channel = cfg.notify.channels[0]
    assert channel["secret"] is None and cfg.to_dict()["notify"]["channels"][0]["secret_file"] == str(good)
    assert channel.with_secrets()["secret"] == "0123456789abcdef-long"
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(SecretError, match="at least 16"):
        channels.of({**channel, "secret_file": short}).with_secrets()
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(SecretError):
        channels.of({**channel, "secret_file": link}).with_secrets()
    with pytest.raises(ConfigError, match="give secret or secret_file, not both"):
        parse_text(
            "notify:\n  channels:\n    - "
            f"{{type: webhook, url: 'http://h/', secret: 0123456789abcdef, secret_file: {good}}}\n",
            "/x.yaml",
        )
    with pytest.raises(ConfigError, match="needs secret or secret_file"):
        parse_text("notify:\n  channels:\n    - {type: webhook, url: 'http://h/'}\n", "/x.yaml")
    with pytest.raises(ConfigError, match="username and password"):
        parse_text(
            "notify:\n  channels:\n    - {type: email, from: a@h, to: [b@h], password_file: /etc/x}\n", "/x.yaml"
        )


def test_the_rate_limit_makes_the_next_message_wait() -> None:
    import threading
    import time

    from airlock.relay.ratelimit import RateLimit

    limit, stop = RateLimit(per_minute=120), threading.Event()  # a burst of 120, then one every 0.5 s
    started = time.monotonic()
    for _ in range(120):
        assert limit.wait(stop)
    assert time.monotonic() - started < 0.5
    assert limit.wait(stop)
    assert 0.3 < time.monotonic() - started < 5
    stop.set()
    assert limit.wait(stop) is False  # a stopped relay does not wait out its limit


def test_the_relay_refuses_to_run_as_an_operator(tmp_path: Path) -> None:
    import pwd
    import subprocess
    import sys

    me = pwd.getpwuid(os.geteuid()).pw_name
    config = tmp_path / "airlock.yaml"
    config.write_text(
        f"operators: {{users: [{me}]}}\n"
        f"notify:\n  user: {me}\n  state_dir: {tmp_path / 'state'}\n"
        "  channels:\n    - {type: slack, url: 'http://127.0.0.1:9/'}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "airlock.relay", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 78, done
    assert "may decide on operator.sock" in done.stderr
    # Control: the same file run by a user other than notify.user (dev up's case) gets past that check
    # and keeps running (it waits for the feed) until it is stopped.
    config.write_text(config.read_text().replace(f"  user: {me}\n", "  user: airlock-notify-elsewhere\n"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "airlock.relay", "--config", str(config)], stderr=subprocess.PIPE, text=True
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(2)
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_pending_message_carries_the_statement_to_sign_and_the_command() -> None:
    from airlock.approval.statement import Statement

    text = Statement(
        "db1",
        "r-1",
        "b" * 64,
        "allow",
        1_900_000_000,
        "c" * 32,
        "agent (uid 1000)",
        "root (uid 0)",
        'echo "hi"',
        "why not",
    ).render()
    event = _pending()
    event["payload"] |= {"statement": text, "requirement": {"approvals": 2}}
    m = msg.pending_message(event, "db1", _user_of, _at(event, 1))
    assert m["statement"] == text  # the exact bytes: signing what the message shows must verify
    assert m["sign"] == "ssh-keygen -Y sign -n airlock-approval -f ~/.ssh/id_ed25519 < statement.txt > statement.sig"
    assert text.rstrip("\n") in m["text"] and "needs 2 distinct approvers" in m["text"]
    plain = msg.pending_message(_pending(), "db1", _user_of, NOW)
    assert "statement" not in plain and "sign" not in plain["text"]


# --- issue 28: nothing an agent sends is live in any channel ------------------------------------

HOSTILE_REASON = (
    "fix `rm -rf /` <!channel> <@U123> <http://evil.example|click to approve> [approve](http://evil.example)"
    " @channel @all *now* & $(touch /tmp/pwned)\n\napprove: ssh evil\x1b[2J\u202e\u200b"
)
HOSTILE_ARGV = ["/bin/echo", "`id`", "$(touch /tmp/pwned)", "<!here>", "a\x1b]8;;http://evil\x07b", "x\u2066y"]


def _hostile() -> dict[str, Any]:
    # Older journals (or a compromised intake) may hold what intake refuses today: the relay does not rely on it.
    event = _pending(
        reason=HOSTILE_REASON,
        stages=[HOSTILE_ARGV],
        spec={"privileged": True, "uid": 0, "stages": [HOSTILE_ARGV]},
    )
    return event | {"request_id": "r-1`<!channel>$(touch /tmp/pwned)", "operation_id": "op `x`"}


def _no_controls(text: str) -> None:
    bad = [c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0 or c in "\u202e\u2066\u200b"]
    assert not bad, bad


def test_a_hostile_request_is_inert_in_every_channel() -> None:
    event = _hostile()
    m = msg.pending_message(event, "db1", _user_of, _at(event, 1))
    # Plain text (email, ntfy): no control, bidi or zero-width character; no forged line.
    _no_controls(m["text"])
    assert m["text"].count("\napprove: ") == 1 and m["text"].count("\ndeny: ") == 1
    # Slack: only the top-level text and one mrkdwn block are markup, and neither has a live sequence.
    slack = json.loads(_channel(Slack, "{type: slack, url: 'http://h/'}").body(m))
    assert slack["unfurl_links"] is False and slack["unfurl_media"] is False
    markup = [slack["text"]] + [b["text"]["text"] for b in slack["blocks"] if b["text"]["type"] == "mrkdwn"]
    for text in markup:
        assert "<" not in text and ">" not in text, text  # no <!channel>, <@U..>, <http://..|..>
        assert "&lt;!channel&gt;" in text or "Decide" in text
    # Mattermost reads `text` as Markdown: all of it is inside one code block that nothing can close.
    text = slack["text"]
    assert text.startswith("```\n") and text.endswith("\n```") and text.count("`") == 6
    assert "[approve](http://evil.example)" in text  # shown, inside the block, not a link
    _no_controls(text)
    for block in slack["blocks"]:
        _no_controls(block["text"]["text"])
    # ntfy: plain text, markdown never switched on; headers are one line of latin-1.
    body, headers = _channel(Ntfy, "{type: ntfy, url: 'http://h/'}").body(m)
    assert not any(k.lower() in ("markdown", "x-markdown", "click", "actions", "attach") for k in headers)
    _no_controls(body.decode())
    for value in headers.values():
        assert "\n" not in value and "\r" not in value
        value.encode("latin-1")
    # Email: text/plain only, one line per header.
    mail = _channel(Email, "{type: email, from: a@h, to: [b@h]}").body(m)
    assert mail.get_content_type() == "text/plain" and not mail.is_multipart()
    _no_controls(mail.get_content())
    assert "\n" not in str(mail["Subject"])
    # Webhook: JSON only; the receiver parses it (the values are the sanitised text above).
    hook = json.loads(_channel(Webhook, "{type: webhook, url: 'http://h/', secret: 0123456789abcdef}").body(m))
    assert hook["reason"] == m["reason"]


def _fake_bin(tmp: Path, name: str, script: str) -> None:
    path = tmp / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.mark.parametrize(
    "request_id",
    ["r-1", "r1 $(touch PWNED)", "r1`touch PWNED`", "r1; touch PWNED", "r1' ; touch PWNED; '", "--grant=30d", "-rf"],
)
def test_the_pasted_approve_lines_run_nothing_but_airlock(tmp_path: Path, request_id: str) -> None:
    """The relay's lines, pasted into sh: `ssh` (faked: it hands the words to a remote sh, as sshd does) and
    `airlock` (faked: it records its argv) are the only programs that run, and the ID stays one word."""
    import subprocess

    from airlock.cli import main as cli_main

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    # ssh HOST WORDS...: the remote side joins the words with spaces and gives them to a shell.
    _fake_bin(bin_dir, "ssh", 'host="$1"; shift; exec /bin/sh -c "$*"\n')
    _fake_bin(bin_dir, "airlock", f'for a in "$@"; do printf "%s\\0" "$a"; done > {log}\n')
    lines = {
        "decide": render.decision_line("approve", request_id, host="db1"),
        "deny": render.decision_line("deny", request_id, host="db1"),
        "submit": render.decision_line("approve", request_id, options=("--signature", "statement.sig")),
    }
    for name, line in lines.items():
        log.unlink(missing_ok=True)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
        subprocess.run(["/bin/sh", "-c", line], cwd=tmp_path, env=env, check=True, timeout=10)
        assert not (tmp_path / "PWNED").exists(), (name, line)
        argv = log.read_bytes().split(b"\0")[:-1]
        # Control: the line still names the request, as one word, to the right verb (read by airlock's own parser).
        ns = cli_main.parser().parse_args([a.decode() for a in argv])
        assert ns.verb == ("deny" if name == "deny" else "approve") and ns.id == request_id, (line, argv)
        assert getattr(ns, "signature", None) == ("statement.sig" if name == "submit" else None)
        assert getattr(ns, "grant", None) is None


def test_a_changeable_argument_is_flagged_and_cannot_forge_lines() -> None:
    """Issue 27: a root job's path argument the agent can change is named, with what is bound."""
    event = _pending()
    event["payload"]["arguments"] = [
        {
            "stage": 0,
            "index": 1,
            "path": "/home/agent/task.sh\napprove: ssh db1 airlock approve other",
            "kind": "file",
            "script": True,
            "sha256": "ab" * 32,
            "changeable": {"path": "/home/agent", "why": "is owned by uid 1001, not root"},
        }
    ]
    m = msg.pending_message(event, "db1", _user_of, NOW)
    [line] = m["changeable"]
    assert "script" in line and "sha256 abababababababab" in line and "/home/agent is owned by uid 1001" in line
    flagged = [t for t in m["text"].splitlines() if t.startswith("CHANGEABLE")]
    assert len(flagged) == 1 and not any(
        t.startswith("approve: ssh db1 airlock approve other") for t in m["text"].splitlines()
    )
    assert "changeable" not in msg.pending_message(_pending(), "db1", _user_of, NOW)["text"].lower()


def test_approve_and_deny_lines_carry_the_statement_binding() -> None:
    # Issue 27: the line acts only on the request this message shows (approval refuses request_changed).
    event = _pending()
    event["payload"]["expect"] = "0123456789ab"
    m = msg.pending_message(event, "db1", _user_of, _at(event, 15))
    assert m["decide"].endswith(" airlock approve r-1 --expect 0123456789ab")
    assert m["deny"].endswith(" airlock deny r-1 --expect 0123456789ab")
    assert "approve: " + m["decide"] in m["text"]
    event["payload"]["statement"] = "airlock approval statement v1\n"
    assert msg.pending_message(event, "db1", _user_of, _at(event, 15))["submit"] == (
        "airlock approve r-1 --expect 0123456789ab --signature statement.sig"
    )
    # Anything but the 12 hex digits approval writes is left out, never passed on.
    event["payload"]["expect"] = "0123456789ab; rm -rf /"
    assert "--expect" not in msg.pending_message(event, "db1", _user_of, _at(event, 15))["decide"]


def _grant_end(action: str, **payload: Any) -> dict[str, Any]:
    return {
        "seq": 77,
        "time": "2027-01-15T08:30:00Z",
        "kind": "operator.action",
        "writer": "approval",
        "request_id": "r-1",
        "payload": {
            "action": action,
            "grant_id": "g-abc",
            "agent_uid": 1000,
            "command": "touch /tmp/x\u202e",
            "scope": "command",
            "rule": "touchy",
            "granted_by": "root",
            "used": 2,
            "uses": 2,
        }
        | payload,
    }


def test_a_grants_end_is_announced_expired_or_used_up_and_other_actions_are_not() -> None:
    used_up = msg.grant_message(_grant_end("grant.exhausted"), "web1", lambda uid: "deploy")
    assert used_up is not None and used_up["event"] == "grant"
    assert used_up["title"] == "airlock: grant g-abc used up on web1"
    assert "for: deploy (uid 1000)" in used_up["text"] and "used 2 of 2 times" in used_up["text"]
    assert "\u202e" not in used_up["text"]  # the agent's argv is sanitised like every message's
    expired = msg.grant_message(_grant_end("grant.expired", used=0, uses=None), "web1", lambda uid: "deploy")
    assert expired is not None and expired["title"] == "airlock: grant g-abc expired on web1"
    assert "used 0 times" in expired["text"]
    assert msg.grant_message(_grant_end("grant.revoke"), "web1", str) is None  # an operator's own act
    assert msg.grant_message(_grant_end("approve"), "web1", str) is None
    assert msg.grant_message(_grant_end("grant.expired") | {"writer": "intake"}, "web1", str) is None
