"""The reviewer tier (issue 34): it decides only where the rules let it, and never lets in what it may not.

A live `airlock dev up` stack (as root) with a reviewer script: a Python
program in a root-only folder, run by airlock-runner as a throwaway user of
its own.  The script answers from the request it is shown: a path naming
``allow-me`` gets an allow, ``deny-me`` a deny, ``sleep-me`` no answer in
time, ``crash-me`` an exit 3 after a valid allow, ``garbage-me`` nonsense,
``flip-me`` an ask the first time and an allow afterwards, ``escape-me`` an
allow whose reason carries terminal escapes and chat markup, ``dump-me`` an
ask after writing what it was given (and as whom it ran) to a file.

What each test shows, with its control:
- a valid allow on a ``reviewer: allow`` rule runs the job without a person,
  journaled ``by: reviewer NAME`` with its reason (the control for the rest:
  the same script *can* let work in);
- a deny refuses it; a timeout, a crash (even after printing an allow) and
  garbage each leave the request to people, with the opinion shown;
- a quorum rule among the deciding rules, a ``reviewer: advise`` rule, and
  a root job whose path argument someone else can change each stay with
  people, though the reviewer said allow (controls: the same allow decides
  on the plain rule / a root-owned file);
- a request a person denied is not then allowed by the reviewer (control:
  another request the same script flips from ask to allow is allowed);
- the reviewer runs as its own user and never sees an environment value,
  a protected value or a file write's content;
- terminal escapes in its reason reach `airlock pending` escaped.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from secsupport import agent_request, final, needs_root, red_stack, replies, throwaway_user

from airlock.common.wire import operator as op
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Empty, Verb

from support import Stack

pytestmark = needs_root

REVIEWER = r"""#!/usr/bin/python3
import json, os, sys, time
statement = json.load(sys.stdin)
text = statement["command"]
state = sys.argv[1]
def say(decision, reason):
    print(json.dumps({"decision": decision, "reason": reason}))
if "dump-me" in text:
    with open(os.path.join(state, "dump-file.json" if statement.get("file") else "dump.json"), "w") as f:
        json.dump({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "statement": statement,
                   "environ": dict(os.environ)}, f)
    say("ask", "dumped")
elif "sleep-me" in text:
    time.sleep(60)
    say("allow", "too late")
elif "crash-me" in text:
    say("allow", "then crashed")
    sys.exit(3)
elif "flood-me" in text:
    sys.stdout.write("x" * (8 << 20))
    say("allow", "after a flood")
elif "garbage-me" in text:
    print("sure, go ahead")
elif "escape-me" in text:
    say("allow", "fine \x1b[2J\x1b[31mAPPROVED\x1b[0m <!channel> *bold*")
elif "flip-me" in text:
    marker = os.path.join(state, "flip-" + statement["command"].replace("/", "_"))
    if os.path.exists(marker):
        say("allow", "seen before")
    else:
        open(marker, "w").close()
        say("ask", "first time")
elif "deny-me" in text:
    say("deny", "this path is off limits")
elif "allow-me" in text:
    say("allow", "a harmless touch")
else:
    say("ask", "no opinion")
"""

A = TypeVar("A", bound=Message)


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("alrva") as alice, throwaway_user("alrvr") as reviewer:
        yield alice, reviewer


@pytest.fixture(scope="module")
def state(users: tuple[Any, Any]) -> Iterator[Path]:
    _, reviewer = users
    folder = Path(tempfile.mkdtemp(prefix="alrv-state", dir="/tmp"))
    os.chown(folder, reviewer.pw_uid, reviewer.pw_gid)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def rstack(users: tuple[Any, Any], state: Path) -> Iterator[Stack]:
    alice, reviewer = users
    home = Path(tempfile.mkdtemp(prefix="alrv-bin", dir="/tmp"))
    os.chmod(home, 0o755)
    script = home / "site-reviewer"
    script.write_text(REVIEWER, encoding="utf-8")
    os.chmod(script, 0o755)
    config = f"""
agents:
  users: [{alice.pw_name}]
approval:
  timeout_seconds: 40
  reviewer_command: [{script}, {state}]
  reviewer_user: {reviewer.pw_name}
  reviewer_timeout_seconds: 3
  reviewer_name: site
policy:
  default: deny
  rules:
    - name: touchy
      decision: ask
      reviewer: allow
      privileged: false
      commands: [[/usr/bin/touch, "..."]]
    - name: advised
      decision: ask
      reviewer: advise
      privileged: false
      commands: [[/usr/bin/mkdir, "..."]]
    - name: pair
      decision: ask
      approvals: 2
      privileged: false
      commands: [[/usr/bin/touch, "-c", "..."]]
    - name: readers
      decision: ask
      reviewer: allow
      privileged: true
      commands: [[/usr/bin/cat, "..."]]
    - name: writes
      decision: ask
      reviewer: allow
      privileged: false
      files:
        - tools: [files_write]
          paths: [/tmp/...]
"""
    with red_stack(config) as stack:
        yield stack
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def place(users: tuple[Any, Any]) -> Iterator[Path]:
    alice, _ = users
    folder = Path(tempfile.mkdtemp(prefix="alrv-work", dir="/tmp"))
    os.chown(folder, alice.pw_uid, alice.pw_gid)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def operator(stack: Stack, verb: Verb[A, Any], args: A) -> dict[str, Any]:
    from airlock.common import client

    _, reply = client.call(str(stack.operator), verb, args, timeout=30)
    assert reply.get("ok"), reply
    data: dict[str, Any] = reply["data"]
    return data


def pending_entry(stack: Stack, request_id: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in operator(stack, op.PENDING, Empty()).get("pending") or []:
            if entry.get("request_id") == request_id:
                found: dict[str, Any] = entry
                return found
        time.sleep(0.1)
    raise AssertionError(f"{request_id} never became pending")


def ask(stack: Stack, user: Any, argv: list[str], *, privileged: bool = False, **extra: Any) -> tuple[Any, str]:
    request_id = f"rv-{uuid.uuid4()}"
    args: dict[str, Any] = {"argv": argv, "privileged": privileged, "operation_id": f"op-{uuid.uuid4()}"} | extra
    return agent_request(stack.agent, user, "exec", args, request_id=request_id), request_id


def decided(stack: Stack, request_id: str) -> dict[str, Any]:
    shown = operator(stack, op.SHOW, op.Show(request_id))
    for event in shown.get("events") or []:
        if event.get("kind") == "approval.decided":
            payload: dict[str, Any] = event["payload"]
            return payload
    raise AssertionError(f"no decision journaled for {request_id}: {shown}")


def people_decide(stack: Stack, proc: Any, request_id: str) -> dict[str, Any]:
    """The request waits for a person; the opinion is shown; root denies it, and nothing ran."""
    entry = pending_entry(stack, request_id)
    operator(stack, op.DENY, op.Decision(request_id, reason="test"))
    reply = final(replies(proc))
    assert reply["ok"] is False
    assert reply["error"]["code"] == "denied"
    assert "operator" in reply["error"]["message"]
    opinion: dict[str, Any] = entry["reviewer"]
    assert opinion["decides"] is False
    return opinion


def test_an_allow_on_a_rule_that_permits_it_decides(rstack: Stack, users: Any, place: Path) -> None:
    alice, _ = users
    target = place / "allow-me"
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(target)])
    reply = final(replies(proc))
    assert reply["ok"] is True, reply
    assert target.exists()
    record = decided(rstack, request_id)
    assert record["by"] == "reviewer site"
    assert record["reason"] == "a harmless touch"
    assert record["reviewer"]["decides"] is True


def test_a_deny_refuses(rstack: Stack, users: Any, place: Path) -> None:
    alice, _ = users
    target = place / "deny-me"
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(target)])
    reply = final(replies(proc))
    assert reply["ok"] is False
    assert reply["error"]["code"] == "denied"
    assert "reviewer site" in reply["error"]["message"]
    assert not target.exists()
    assert decided(rstack, request_id)["by"] == "reviewer site"


@pytest.mark.parametrize(
    ("marker", "outcome"),
    [("sleep-me", "timeout"), ("crash-me", "crashed"), ("garbage-me", "garbage"), ("flood-me", "garbage")],
)
def test_a_failed_reviewer_asks_people(rstack: Stack, users: Any, place: Path, marker: str, outcome: str) -> None:
    alice, _ = users
    target = place / marker
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(target)])
    opinion = people_decide(rstack, proc, request_id)
    assert opinion["outcome"] == outcome
    assert opinion["decision"] == "ask"
    assert not target.exists()
    # Nothing of it is left running (the sleeper was killed at its deadline).
    _, reviewer = users
    assert subprocess.run(["pgrep", "-u", str(reviewer.pw_uid)], capture_output=True).returncode == 1


def test_a_quorum_rule_is_never_the_reviewers(rstack: Stack, users: Any, place: Path) -> None:
    alice, _ = users
    target = place / "allow-me-pair"
    target.touch()
    # touchy (reviewer: allow) and pair (approvals: 2) both decide: the quorum rule keeps it with people.
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", "-c", str(target)])
    opinion = people_decide(rstack, proc, request_id)
    assert opinion["decision"] == "allow"
    assert opinion["may"] == "advise"


def test_advise_only_shows(rstack: Stack, users: Any, place: Path) -> None:
    alice, _ = users
    target = place / "allow-me-dir"
    proc, request_id = ask(rstack, alice, ["/usr/bin/mkdir", str(target)])
    opinion = people_decide(rstack, proc, request_id)
    assert (opinion["decision"], opinion["may"]) == ("allow", "advise")
    assert not target.exists()


def test_flagged_arguments_stay_with_people(rstack: Stack, users: Any, place: Path) -> None:
    alice, _ = users
    theirs = place / "allow-me-theirs"
    theirs.write_text("alice can change this\n")
    os.chown(theirs, alice.pw_uid, alice.pw_gid)
    proc, request_id = ask(rstack, alice, ["/usr/bin/cat", str(theirs)], privileged=True)
    opinion = people_decide(rstack, proc, request_id)
    assert opinion["decision"] == "allow"
    assert "path arguments" in opinion["why_not"]
    # Control: the same rule and answer on a file only root can change decides.
    root_dir = Path(tempfile.mkdtemp(prefix="alrv-root", dir="/tmp"))
    os.chmod(root_dir, 0o755)
    mine = root_dir / "allow-me-root"
    mine.write_text("root's\n")
    try:
        proc, request_id = ask(rstack, alice, ["/usr/bin/cat", str(mine)], privileged=True)
        reply = final(replies(proc))
        assert reply["ok"] is True, reply
        assert decided(rstack, request_id)["by"] == "reviewer site"
    finally:
        shutil.rmtree(root_dir, ignore_errors=True)


def test_never_allows_what_a_person_denied(rstack: Stack, users: Any, place: Path) -> None:
    alice, _ = users
    denied = place / "flip-me-denied"
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(denied)])
    first = people_decide(rstack, proc, request_id)
    assert first["decision"] == "ask"
    # The same request again: the reviewer now says allow, but a person said no to it.
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(denied)])
    again = people_decide(rstack, proc, request_id)
    assert again["decision"] == "allow"
    assert "denied" in again["why_not"]
    assert not denied.exists()
    # And after approval restarted (its memory gone): the journal still says a person denied it.
    rstack.kill_service("approval")
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(denied)])
    after = people_decide(rstack, proc, request_id)
    assert (after["decision"], after["decides"]) == ("allow", False)
    assert not denied.exists()
    # Control: a request nobody denied, flipped the same way, is allowed the second time.
    other = place / "flip-me-other"
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(other)])
    pending_entry(rstack, request_id)
    operator(rstack, op.APPROVE, op.Decision(request_id, reason="test"))
    assert final(replies(proc))["ok"] is True
    other.unlink()
    proc, request_id = ask(rstack, alice, ["/usr/bin/touch", str(other)])
    assert final(replies(proc))["ok"] is True
    assert decided(rstack, request_id)["by"] == "reviewer site"


def test_runs_as_its_own_user_and_sees_no_values(rstack: Stack, users: Any, place: Path, state: Path) -> None:
    alice, reviewer = users
    proc, request_id = ask(
        rstack,
        alice,
        ["/usr/bin/touch", str(place / "dump-me")],
        env={"LANG": "plain-value-7a1"},
        protected_env={"TZ": "secret-value-9b2"},
    )
    pending_entry(rstack, request_id)
    operator(rstack, op.DENY, op.Decision(request_id))
    replies(proc)
    dump = json.loads((state / "dump.json").read_text())
    assert (dump["uid"], dump["gid"], dump["groups"]) == (reviewer.pw_uid, reviewer.pw_gid, [])
    text = json.dumps(dump)
    assert "secret-value-9b2" not in text
    assert "plain-value-7a1" not in text
    assert dump["statement"]["env_names"] == ["LANG", "TZ"]
    assert sorted(dump["environ"]) == ["LANG", "PATH"]
    assert pwd.getpwuid(dump["uid"]).pw_name != "root"


def test_escapes_in_its_reason_are_neutralised(rstack: Stack, users: Any, place: Path) -> None:
    alice, _ = users
    # advised (reviewer: advise) keeps it pending, so `airlock pending` shows the opinion.
    proc, request_id = ask(rstack, alice, ["/usr/bin/mkdir", str(place / "escape-me")])
    entry = pending_entry(rstack, request_id)
    assert "\x1b[31m" in entry["reviewer"]["reason"]  # the data is kept as given ...
    shown = subprocess.run(
        [sys.executable, "-m", "airlock", "pending", "--socket", str(rstack.operator)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "reviewer site: allow" in shown
    assert "\x1b" not in shown  # ... and shown escaped
    assert "\\x1b[31mAPPROVED" in shown
    detail = subprocess.run(
        [sys.executable, "-m", "airlock", "show", "--socket", str(rstack.operator), request_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "site: allow — fine \\x1b[2J\\x1b[31mAPPROVED" in detail
    assert "\x1b" not in detail
    operator(rstack, op.DENY, op.Decision(request_id))
    replies(proc)


def test_a_file_write_is_shown_without_its_content(rstack: Stack, users: Any, place: Path, state: Path) -> None:
    alice, _ = users
    target = place / "dump-me-file"
    secret = "file-content-5c3"
    request_id = f"rv-{uuid.uuid4()}"
    args = {"path": str(target), "privileged": False, "content": base64.b64encode(secret.encode()).decode()}
    proc = agent_request(rstack.agent, alice, "files_write", args, request_id=request_id)
    entry = pending_entry(rstack, request_id)
    assert entry["reviewer"]["reason"] == "dumped"
    operator(rstack, op.DENY, op.Decision(request_id))
    replies(proc)
    dump = json.loads((state / "dump-file.json").read_text())
    assert dump["statement"]["file"] == {"tool": "files_write", "path": str(target)}
    assert dump["statement"]["command"] == f"files_write {target}"
    assert secret not in json.dumps(dump) and base64.b64encode(secret.encode()).decode() not in json.dumps(dump)
    assert not target.exists()
