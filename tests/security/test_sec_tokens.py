"""A session token is its holder's, for every verb (issue 39, items 1 and 2).

With ``agents.require_token: true`` an operator issues alice a token for
session ``sandbox``.  Attacks:

1. alice sends ``files_read`` naming session ``nightly``, which a rule lets
   read a root-only file: intake used to substitute the token's session only
   for ``exec``, so the file verbs ran in the session the request claimed.
   Now a conflicting session is refused and nothing is read or journaled.
2. mallory, another agent, reads alice's token (``airlock run --token T``
   put it in a world-readable command line) and sends it as her own: a token
   held no uid, so she ran in alice's session.  Now the token is refused for
   every uid but alice's, and ``airlock run`` takes no token in argv.

Controls: alice's own ``files_read`` in her own session, and ``exec`` with her
token, run -- so the refusals are the fixes', not a broken setup; and with a
``nightly`` token the same ``files_read`` does read the file (the rule works).
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_request, as_user, final, needs_root, red_stack, replies, root_dir, throwaway_user

from support import Stack

pytestmark = needs_root

SECRET = "root-only secret 7f3a\n"


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("altka") as alice, throwaway_user("altkm") as mallory:
        yield alice, mallory


@pytest.fixture(scope="module")
def secret() -> Iterator[Path]:
    folder = root_dir()
    path = folder / "nightly.conf"
    path.write_text(SECRET)
    path.chmod(0o600)
    yield path
    path.unlink()
    folder.rmdir()


@pytest.fixture(scope="module")
def tstack(users: tuple[Any, Any], secret: Path) -> Iterator[Stack]:
    alice, mallory = users
    config = f"""
agents:
  users: [{alice.pw_name}, {mallory.pw_name}]
  require_token: true
approval:
  timeout_seconds: 5
policy:
  default: deny
  rules:
    - name: nightly-reads
      decision: allow
      sessions: [nightly]
      files:
        - tools: [files_read]
          paths: [{secret.parent}/...]
    - name: sandbox-reads
      decision: allow
      sessions: [sandbox]
      files:
        - tools: [files_read]
          paths: [/etc/hostname]
    - name: ids
      decision: allow
      sessions: [sandbox]
      commands: [[/usr/bin/id]]
"""
    with red_stack(config) as stack:
        yield stack


def issue(stack: Stack, session: str, user: str) -> str:
    reply = stack.native("token.issue", {"session": session, "user": user, "ttl_seconds": 600}, path=stack.operator)
    assert reply["ok"] is True, reply
    token: str = reply["data"]["token"]
    return token


def ask(stack: Stack, user: Any, verb: str, args: dict[str, Any], token: str) -> dict[str, Any]:
    body = {"operation_id": f"op-{uuid.uuid4()}"} | args
    return final(replies(agent_request(stack.agent, user, verb, body, token=token)))


def read_secret(stack: Stack, user: Any, secret: Path, token: str, **extra: Any) -> dict[str, Any]:
    return ask(stack, user, "files_read", {"path": str(secret), "privileged": True} | extra, token)


def journaled(stack: Stack, request_id: str) -> list[dict[str, Any]]:
    return [r for r in stack.journal_rows() if r["request_id"] == request_id]


def test_the_token_session_binds_the_file_verbs(tstack: Stack, users: tuple[Any, Any], secret: Path) -> None:
    alice, _ = users
    token = issue(tstack, "sandbox", alice.pw_name)
    forged = read_secret(tstack, alice, secret, token, session="nightly")
    assert forged["ok"] is False and forged["error"]["code"] == "invalid_arguments", forged
    assert forged["error"]["details"] == {"field": "session"}
    assert "content" not in str(forged) and not journaled(tstack, forged["id"])
    # Without a session argument the token's own applies: sandbox may not read it.
    plain = read_secret(tstack, alice, secret, token)
    assert plain["ok"] is False and plain["error"]["code"] == "denied", plain
    assert {r["session"] for r in journaled(tstack, plain["id"])} == {"sandbox"}
    # Controls: her own session's file, and the nightly rule with a nightly token.
    own = ask(tstack, alice, "files_read", {"path": "/etc/hostname", "privileged": True}, token)
    assert own["ok"] is True, own
    nightly = read_secret(tstack, alice, secret, issue(tstack, "nightly", alice.pw_name))
    assert nightly["ok"] is True, nightly
    assert base64.b64decode(nightly["data"]["content"]) == SECRET.encode()


def test_a_token_works_only_for_the_agent_it_was_issued_for(tstack: Stack, users: tuple[Any, Any]) -> None:
    alice, mallory = users
    token = issue(tstack, "sandbox", alice.pw_name)
    stolen = ask(tstack, mallory, "exec", {"argv": ["id"], "privileged": True}, token)
    assert stolen["ok"] is False and stolen["error"] == {
        "code": "unauthorized",
        "message": "unauthorized",
        "details": {},
    }
    assert not journaled(tstack, stolen["id"])
    # Control: alice's own use of it runs id as root in her session.
    mine = ask(tstack, alice, "exec", {"argv": ["id"], "privileged": True}, token)
    assert mine["ok"] is True, mine
    assert b"uid=0(root)" in base64.b64decode(mine["data"]["stdout"])


def test_airlock_run_never_puts_a_token_in_its_command_line(
    tstack: Stack, users: tuple[Any, Any], tmp_path: Path
) -> None:
    alice, _ = users
    token = issue(tstack, "sandbox", alice.pw_name)
    cli = [sys.executable, "-m", "airlock", "run", "--socket", str(tstack.agent)]
    refused = subprocess.run([*cli, "--token", token, "--", "id"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "--token is not accepted" in refused.stderr
    # A token file must be the caller's and closed to others (as ssh insists for a key).
    loose = tmp_path / "loose.token"
    loose.write_text(token + "\n")
    loose.chmod(0o644)
    run = subprocess.run([*cli, "--token-file", str(loose), "--", "id"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 125 and "too open" in run.stderr
    # Control: alice's own 0600 file, and $AIRLOCK_TOKEN, both work.
    home = Path(alice.pw_dir)
    tight = home / "token"
    tight.write_text(token + "\n")
    os.chown(tight, alice.pw_uid, alice.pw_gid)
    tight.chmod(0o600)
    kwargs = as_user(alice)
    kwargs["env"] = kwargs["env"] | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    by_file = subprocess.run(
        [*cli, "--token-file", str(tight), "--", "id"], capture_output=True, text=True, timeout=30, **kwargs
    )
    assert by_file.returncode == 0 and "uid=0(root)" in by_file.stdout, by_file.stderr
    kwargs["env"] = kwargs["env"] | {"AIRLOCK_TOKEN": token}
    by_env = subprocess.run([*cli, "--", "id"], capture_output=True, text=True, timeout=30, **kwargs)
    assert by_env.returncode == 0 and "uid=0(root)" in by_env.stdout, by_env.stderr
