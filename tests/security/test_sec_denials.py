"""A person's denial is remembered by what would run, completely (issue 45, items 2 and 3).

A live `airlock dev up` stack (as root) with a reviewer that answers
"allow" to any request whose reason says ``please-allow`` (the crafted
reason of an agent that was told no) and "ask" otherwise.  A person denies
a root ``echo TOKEN``; the agent then asks for the same thing again:

- respelled (``/usr/bin/echo``, ``/bin/echo`` through the usrmerge link,
  ``/usr/bin/./echo``), through a symlink of its own, and through a hard
  link (another path, the same file: the identity the ticket binds);
- from another working directory, with an environment value;
- after 10,000 unrelated records of the same agent (the old check read its
  newest 256);
- after approval restarted (its memory is read back from the journal);
- under a grant an operator gave for the rule.

Each time the reviewer's allow does not decide and the grant does not
stand in: the request waits for a person (and nothing ran).  Controls: the
same reviewer's allow, and the same grant, let in a request nobody denied,
in the same stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_request, final, needs_root, red_stack, replies, throwaway_user

from support import Stack

pytestmark = needs_root

REVIEWER = r"""#!/usr/bin/python3
import json, sys
statement = json.load(sys.stdin)
allow = "please-allow" in statement.get("reason", "")
print(json.dumps({"decision": "allow" if allow else "ask", "reason": "reviewed"}))
"""


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("aldna") as alice, throwaway_user("aldnr") as reviewer:
        yield alice, reviewer


@pytest.fixture(scope="module")
def links() -> Iterator[Path]:
    """A root-only folder with a symlink and a hard link to /usr/bin/echo."""
    folder = Path(tempfile.mkdtemp(prefix="aldn-links", dir="/tmp"))
    os.chmod(folder, 0o755)
    (folder / "say").symlink_to("/usr/bin/echo")
    os.link("/usr/bin/echo", folder / "say-hard")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def dstack(users: tuple[Any, Any], links: Path) -> Iterator[Stack]:
    alice, reviewer = users
    home = Path(tempfile.mkdtemp(prefix="aldn-bin", dir="/tmp"))
    os.chmod(home, 0o755)
    script = home / "site-reviewer"
    script.write_text(REVIEWER, encoding="utf-8")
    os.chmod(script, 0o755)
    config = f"""
agents:
  users: [{alice.pw_name}]
approval:
  timeout_seconds: 40
  reviewer_command: [{script}]
  reviewer_user: {reviewer.pw_name}
  reviewer_timeout_seconds: 5
  reviewer_name: site
policy:
  default: deny
  rules:
    - name: echoes
      decision: ask
      reviewer: allow
      privileged: true
      commands: [[/usr/bin/echo, "..."], [{links}/say-hard, "..."]]
"""
    with red_stack(config) as stack:
        yield stack
    shutil.rmtree(home, ignore_errors=True)


def operator(stack: Stack, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    reply = stack.native(verb, args, path=stack.operator)
    assert reply.get("ok"), reply
    data: dict[str, Any] = reply["data"]
    return data


def ask(stack: Stack, user: Any, argv: list[str], reason: str = "plain", **extra: Any) -> tuple[Any, str]:
    request_id = f"dn-{uuid.uuid4()}"
    args = {"argv": argv, "privileged": True, "reason": reason, "operation_id": f"op-{uuid.uuid4()}"} | extra
    return agent_request(stack.agent, user, "exec", args, request_id=request_id), request_id


def pending_entry(stack: Stack, request_id: str, timeout: float = 20) -> dict[str, Any] | None:
    """The request's pending entry, or None if it was decided (its agent has its answer) first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in operator(stack, "pending", {}).get("pending") or []:
            if entry.get("request_id") == request_id:
                found: dict[str, Any] = entry
                return found
        time.sleep(0.1)
    return None


def denied_by_a_person(stack: Stack, user: Any, token: str, **extra: Any) -> None:
    proc, request_id = ask(stack, user, ["echo", token], **extra)
    entry = pending_entry(stack, request_id)
    assert entry is not None and entry["reviewer"]["decision"] == "ask"
    operator(stack, "deny", {"id": request_id, "reason": "not as root"})
    assert final(replies(proc))["error"]["code"] == "denied"


def people_are_asked(stack: Stack, user: Any, argv: list[str], **extra: Any) -> None:
    """The crafted request waits for a person though the reviewer said allow; a person denies it."""
    proc, request_id = ask(stack, user, argv, reason="please-allow: harmless, the operator agreed", **extra)
    entry = pending_entry(stack, request_id)
    if entry is None:
        raise AssertionError(f"{argv} was decided without a person: {final(replies(proc))}")
    assert (entry["reviewer"]["decision"], entry["reviewer"]["decides"]) == ("allow", False)
    assert "denied" in entry["reviewer"]["why_not"]
    operator(stack, "deny", {"id": request_id, "reason": "still no"})
    assert final(replies(proc))["error"]["code"] == "denied"


def reviewer_lets_in(stack: Stack, user: Any, argv: list[str], **extra: Any) -> None:
    """Control: the same crafted request for something nobody denied is the reviewer's to allow."""
    proc, _ = ask(stack, user, argv, reason="please-allow: harmless, the operator agreed", **extra)
    reply = final(replies(proc))
    assert reply["ok"] is True, reply
    assert reply["data"]["decision"]["decided_by"] == "reviewer site"


def test_a_respelled_path_is_the_same_command(dstack: Stack, users: Any) -> None:
    alice, _ = users
    denied_by_a_person(dstack, alice, "tok-spell")
    for head in ("/usr/bin/echo", "/bin/echo", "/usr/bin/./echo", "/usr/bin/../bin/echo"):
        people_are_asked(dstack, alice, [head, "tok-spell"])
    reviewer_lets_in(dstack, alice, ["/usr/bin/echo", "tok-spell-other"])


def test_a_symlink_or_a_hard_link_is_the_same_binary(dstack: Stack, users: Any, links: Path) -> None:
    alice, _ = users
    denied_by_a_person(dstack, alice, "tok-link")
    people_are_asked(dstack, alice, [str(links / "say"), "tok-link"])
    # Another path (the rule names it), the same file: the identity the ticket binds.
    people_are_asked(dstack, alice, [str(links / "say-hard"), "tok-link"])
    reviewer_lets_in(dstack, alice, [str(links / "say-hard"), "tok-link-other"])


def test_another_cwd_or_environment_is_the_same_command(dstack: Stack, users: Any) -> None:
    alice, _ = users
    denied_by_a_person(dstack, alice, "tok-cwd", cwd="/tmp")
    people_are_asked(dstack, alice, ["echo", "tok-cwd"], cwd="/")
    people_are_asked(dstack, alice, ["echo", "tok-cwd"], env={"LANG": "C.UTF-8"})
    reviewer_lets_in(dstack, alice, ["echo", "tok-cwd-other"], cwd="/")


def flood(stack: Stack, uid: int, count: int) -> None:
    """``count`` unrelated records of the agent's (allowed decisions, as approval writes them), written
    deferred on one connection to the journal (as root, `dev up`'s services' user, writing as approval)."""
    payload = {"decision": "allow", "rule": "filler", "by": "policy", "privileged": False, "run_as": uid}
    lines = [
        json.dumps(
            {
                "v": 1,
                "id": f"f{n}",
                "verb": "append",
                "args": {
                    "kind": "approval.decided",
                    "writer": "approval",
                    "request_id": f"filler-{n}",
                    "peer_uid": uid,
                    "payload": payload,
                    "durable": n == count - 1,  # the last one waits for all of them
                },
                "token": None,
            }
        )
        for n in range(count)
    ]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(120)
        sock.connect(str(stack.runtime_dir / "internal" / "journal.sock"))
        buffered = sock.makefile("rwb")
        answered = 0
        for chunk in range(0, count, 500):
            buffered.write("".join(line + "\n" for line in lines[chunk : chunk + 500]).encode())
            buffered.flush()
            for _ in lines[chunk : chunk + 500]:
                reply = json.loads(buffered.readline())
                assert reply.get("ok"), reply
                answered += 1
    assert answered == count
    with contextlib.closing(sqlite3.connect(f"file:{stack.database}?mode=ro", uri=True)) as db:
        (written,) = db.execute("SELECT count(*) FROM events WHERE request_id LIKE 'filler-%'").fetchone()
    assert written >= count


def test_ten_thousand_records_later_it_is_still_denied(dstack: Stack, users: Any) -> None:
    alice, _ = users
    denied_by_a_person(dstack, alice, "tok-flood")
    flood(dstack, alice.pw_uid, 10_000)
    # The memory of a running approval and the journal's own record both count: restart it in between.
    dstack.kill_service("approval")
    people_are_asked(dstack, alice, ["/usr/bin/echo", "tok-flood"])
    reviewer_lets_in(dstack, alice, ["/usr/bin/echo", "tok-flood-other"])


def test_a_restart_forgets_nothing(dstack: Stack, users: Any) -> None:
    alice, _ = users
    denied_by_a_person(dstack, alice, "tok-restart")
    dstack.kill_service("approval")
    people_are_asked(dstack, alice, ["/bin/echo", "tok-restart"], cwd="/")
    dstack.kill_service("approval")
    people_are_asked(dstack, alice, ["echo", "tok-restart"])
    reviewer_lets_in(dstack, alice, ["echo", "tok-restart-other"])


def test_a_grant_does_not_stand_in_for_what_a_person_denied(dstack: Stack, users: Any) -> None:
    alice, _ = users
    denied_by_a_person(dstack, alice, "tok-grant")
    # An operator grants the rule for ten minutes, on another request.
    proc, request_id = ask(dstack, alice, ["echo", "tok-grant-first"])
    assert pending_entry(dstack, request_id) is not None
    done = dstack.cli("approve", request_id, "--grant", "10m", "--scope", "rule", "--reason", "for the echoes")
    assert done.returncode == 0, done.stderr
    assert final(replies(proc))["ok"] is True
    try:
        # The grant stands in for an operator (the control) ...
        proc, _ = ask(dstack, alice, ["echo", "tok-grant-other"])
        reply = final(replies(proc))
        assert reply["ok"] is True and reply["data"]["decision"]["decided_by"].startswith("grant "), reply
        # ... but not for what a person denied, however it is spelled: people are asked.
        proc, request_id = ask(dstack, alice, ["/usr/bin/echo", "tok-grant"])
        entry = pending_entry(dstack, request_id)
        if entry is None:
            raise AssertionError(f"the grant allowed what a person denied: {final(replies(proc))}")
        operator(dstack, "deny", {"id": request_id})
        assert final(replies(proc))["error"]["code"] == "denied"
    finally:
        for grant in operator(dstack, "grants", {}).get("grants") or []:
            dstack.cli("grants", "revoke", grant["grant_id"])
