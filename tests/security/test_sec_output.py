"""Output logs and credentials (issue 35) against a live stack, played by real throwaway users.

1. An agent cannot read another job's output: not through the agent door
   (no verb reads a log), not through operator.sock (not an operator), not
   from the runner's output directory (root only).  Control: an operator
   reads that job's output through the same door.
2. A rule's credential file that became a symbolic link, or writable by a
   user other than root, after the policy was loaded is refused by the
   runner (``credential_unsafe``) and nothing runs.  Control: the same rule
   with the file as it should be passes the credential check (and, in this
   process-group stack, stops at "needs service containment").
3. The value never appears in the journal's records: only the name and a
   digest.  (journald and the job's output: tests/system/test_7_output.py.)
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_exec, agent_request, as_user, final, needs_root, red_stack, replies, throwaway_user

from support import Stack

pytestmark = needs_root


def _operator_call(stack: Stack, user: pwd.struct_passwd, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    """One request on operator.sock from a process of ``user``."""
    client = (
        "import json, socket, sys\n"
        "job = json.load(sys.stdin)\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(30)\n"
        "try:\n"
        "    s.connect(job['socket'])\n"
        "except OSError as exc:\n"
        "    print(json.dumps([{'refused': str(exc)}])); sys.exit(0)\n"
        "s.sendall(json.dumps(job['request']).encode() + b'\\n'); s.shutdown(socket.SHUT_WR)\n"
        "buf = b''\n"
        "while (chunk := s.recv(65536)):\n"
        "    buf += chunk\n"
        "print(json.dumps([json.loads(l) for l in buf.splitlines() if l.strip()]))\n"
    )
    request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args, "token": None}
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", client],
        input=json.dumps({"socket": stack.operator, "request": request}),
        capture_output=True,
        text=True,
        timeout=60,
        **as_user(user),
    )
    assert done.returncode == 0, done.stderr
    lines: list[dict[str, Any]] = json.loads(done.stdout)
    return lines[-1] if lines else {}


@pytest.fixture(scope="module")
def agents() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    with throwaway_user("alouta") as a, throwaway_user("aloutb") as b:
        yield a, b


def test_an_agent_cannot_read_another_jobs_output(agents: tuple[pwd.struct_passwd, pwd.struct_passwd]) -> None:
    alice, bob = agents
    config = f"""
agents:
  users: [{alice.pw_name}, {bob.pw_name}]
policy:
  default: deny
  rules:
    - name: allow-echo
      decision: allow
      privileged: false
      commands: [[/usr/bin/echo, "..."]]
"""
    private = f"alice-private-{secrets.token_hex(8)}"
    with red_stack(config) as stack:
        os.chmod(stack.operator, 0o666)  # reachable: the door's allow-list is what is tested
        reply = agent_exec(
            stack.agent, alice, {"argv": ["echo", private], "privileged": False, "operation_id": "alice-op"}
        )
        assert reply["ok"], reply
        events = stack.native("show", {"ref": "alice-op"}, path=stack.operator)["data"]["events"]
        request_id = next(e["request_id"] for e in events if e["kind"] == "exec.started")

        # Control: an operator reads alice's output through operator.sock.
        read = stack.native("output", {"ref": request_id}, path=stack.operator)
        assert read["ok"], read
        assert any(private.encode() in __import__("base64").b64decode(c["data"]) for c in read["data"]["chunks"])

        # bob, an agent: the agent door has no verb that reads a log ...
        for verb in ("output", "logs"):
            for ref in (request_id, "alice-op", f"{alice.pw_name}/alice-op"):
                answer = final(replies(agent_request(stack.agent, bob, verb, {"ref": ref})))
                assert not answer["ok"] and answer["error"]["code"] in ("unauthorized", "unknown_verb"), answer
                assert private not in json.dumps(answer)
        # ... operator.sock turns him away ...
        for verb in ("output", "logs"):
            answer = _operator_call(stack, bob, verb, {"ref": request_id})
            assert "refused" in answer or not answer.get("ok"), answer
            assert private not in json.dumps(answer)
        # ... and the runner's files are root's alone (by their own modes: the state folder above is opened up).
        directory = stack.runtime_dir / "state" / "output"
        os.chmod(directory.parent, 0o755)
        done = subprocess.run(
            ["/usr/bin/sh", "-c", f"ls {directory}; cat {directory}/*.gz"],
            capture_output=True,
            text=True,
            errors="replace",
            **as_user(bob),
        )
        assert done.returncode != 0 and "Permission denied" in done.stderr, done
        # bob's own request gets only bob's output.
        mine = agent_exec(stack.agent, bob, {"argv": ["echo", "bob"], "privileged": False, "operation_id": "alice-op"})
        assert mine["ok"] and private not in json.dumps(mine)


CREDENTIAL_RULE = """
agents:
  users: [{agent}]
policy:
  default: deny
  rules:
    - name: with-credential
      decision: allow
      privileged: true
      commands: [[/usr/bin/cat, "..."]]
      credentials:
        db: {path}
"""


def _journal_text(stack: Stack) -> str:
    with sqlite3.connect(f"file:{stack.database}?mode=ro", uri=True) as conn:
        return "\n".join(str(row) for row in conn.execute("SELECT * FROM events"))


@pytest.mark.parametrize("attack", ["symlink", "user-writable", "user-owned"])
def test_an_unsafe_credential_file_is_refused_at_start(
    agents: tuple[pwd.struct_passwd, pwd.struct_passwd], attack: str
) -> None:
    alice, mallory = agents
    where = Path(tempfile.mkdtemp(prefix="alsec-cred", dir="/tmp"))
    os.chmod(where, 0o755)
    value = f"credential-{secrets.token_hex(12)}"
    path = where / "db.pass"
    path.write_text(value + "\n")
    os.chmod(path, 0o600)
    try:
        with red_stack(CREDENTIAL_RULE.format(agent=alice.pw_name, path=path)) as stack:
            # Control: the file as it should be passes the credential check; this stack's process-group
            # containment then refuses (credentials need service containment): nothing ran either way.
            good = agent_exec(stack.agent, alice, {"argv": ["cat", "/etc/hostname"], "privileged": True})
            assert not good["ok"] and good["error"]["code"] == "spawn_failed", good
            assert "runner.containment: service" in good["error"]["message"]

            if attack == "symlink":  # after the policy was loaded: the name now leads elsewhere
                secret = where / "elsewhere"
                secret.write_text("not the credential\n")
                path.unlink()
                path.symlink_to(secret)
            elif attack == "user-writable":
                os.chmod(path, 0o666)
            else:
                os.chown(path, mallory.pw_uid, mallory.pw_gid)
            bad = agent_exec(stack.agent, alice, {"argv": ["cat", "/etc/hostname"], "privileged": True})
            assert not bad["ok"] and bad["error"]["code"] == "credential_unsafe", bad
            assert str(path) in bad["error"]["message"]
            # Only names and digests ever reach the journal; never the value.
            assert value not in _journal_text(stack)
            logs = "".join(p.read_text() for p in (stack.runtime_dir / "logs").glob("*.log"))
            assert value not in logs
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_policy_naming_an_unsafe_credential_file_does_not_load(tmp_path: Path) -> None:
    from airlock.approval.policyfile import PolicyError, parse_policy_text

    good = tmp_path / "good"
    good.write_text("credential-value\n")
    os.chmod(good, 0o600)
    link = tmp_path / "link"
    link.symlink_to(good)
    writable = tmp_path / "writable"
    writable.write_text("credential-value\n")
    os.chmod(writable, 0o620)
    text = "rules:\n  - name: r\n    decision: allow\n    privileged: true\n    credentials: {{db: {path}}}\n"
    parse_policy_text(text.format(path=good), "/p.yaml", main=False)  # control: the file as it should be
    for bad, message in ((link, "is a symbolic link"), (writable, "is writable by others than root")):
        with pytest.raises(PolicyError) as info:
            parse_policy_text(text.format(path=bad), "/p.yaml", main=False)
        assert f"/p.yaml:5:23: rules[0] (r).credentials.db: {message}" in str(info.value)
