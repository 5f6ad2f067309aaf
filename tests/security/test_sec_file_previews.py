"""Red team (issue 39, items 4, 5, 10): what a privileged write keeps, and who sees the file before approval.

* **Attack 5.** Under ``default: ask`` an agent asks to write a 0600 root
  file it cannot read.  Before anything is approved, an observer reads the
  events feed, ``pending`` and ``show``; the journal's records, the notify
  command's input and the service logs are searched too.  The file's content
  must be in none of them.  Control: for a path a rule names, the preview
  really reads the root-only file and an operator sees its content in the
  diff on operator.sock, while everything else still holds only the diff's
  sha256 and size.
* **Attack 4.** A file whose ACL keeps its owning group out (``group::---``,
  one named user may read, mask ``r``) is rewritten by an approved privileged
  write; a member of the owning group must still be unable to read it, and a
  ``user.*`` attribute must survive.  Control: the same member reads a file
  with the same plain mode and no ACL (what the old write produced).
* **Item 10.** A pending write that changes only bytes that are not UTF-8
  shows the operator a binary change with hex excerpts, not an empty diff.
"""

from __future__ import annotations

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_request, as_user, final, needs_root, replies, throwaway_user

from support import Stack, custom_stack

pytestmark = needs_root
needs_acl = pytest.mark.skipif(
    shutil.which("setfacl") is None or shutil.which("getfacl") is None,
    reason="setfacl/getfacl missing (Debian package acl, in the Makefile's DEB_PACKAGES)",
)

_OPERATOR_CLIENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(job["socket"])
s.sendall(json.dumps(job["request"]).encode() + b"\n")
s.shutdown(socket.SHUT_WR)
buf = b""
while chunk := s.recv(1 << 16):
    buf += chunk
print(json.dumps([json.loads(line) for line in buf.splitlines() if line.strip()]))
"""

_NOTIFY_HOOK = """#!/bin/sh
cat > "{out}/notify-$AIRLOCK_REQUEST_ID.json"
"""


@dataclass
class Lab:
    stack: Stack
    agent: pwd.struct_passwd
    observer: pwd.struct_passwd
    groupie: pwd.struct_passwd  # a member of the owning group of the ACL'd files
    group: int
    rootonly: Path  # 0700 root: no rule names it (the default asks)
    named: Path  # 0700 root: an ask rule names it
    work: Path  # an allow rule lets the agent write here as root
    notified: Path
    runtime: Path


def _config(lab_agent: str, observer: str, rootonly: Path, named: Path, work: Path, hook: Path) -> str:
    return f"""
agents:
  users: [{lab_agent}]
operators:
  observers: {{users: [{observer}], groups: []}}
approval:
  timeout_seconds: 60
  notify_command: [{hook}]
policy:
  default: ask
  rules:
    - name: named-configs-ask
      decision: ask
      users: [{lab_agent}]
      privileged: true
      files:
        - tools: [files_write, files_edit]
          paths: [{named}/...]
    - name: agent-work-as-root
      decision: allow
      users: [{lab_agent}]
      privileged: true
      files:
        - tools: [files_write, files_read]
          paths: [{work}/...]
"""


@contextlib.contextmanager
def _group() -> Iterator[int]:
    name = f"alsecg{secrets.token_hex(3)}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield int(subprocess.run(["getent", "group", name], capture_output=True, text=True).stdout.split(":")[2])
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    tag = secrets.token_hex(4)
    with (
        throwaway_user("alfpa") as agent,
        throwaway_user("alfpo") as observer,
        throwaway_user("alfpg") as groupie,
        _group() as gid,
    ):
        subprocess.run(["usermod", "-aG", str(gid), groupie.pw_name], check=True, capture_output=True)
        rootonly, named, work = (Path(f"/srv/airlock-{what}-{tag}") for what in ("rootonly", "named", "work"))
        runtime = Path(tempfile.mkdtemp(prefix="alfp", dir="/tmp"))
        notified = Path(tempfile.mkdtemp(prefix="alfp-notify", dir="/tmp"))
        hook = notified.parent / f"{notified.name}.sh"
        try:
            for d in (rootonly, named):
                d.mkdir(mode=0o700)
            work.mkdir(mode=0o755)
            hook.write_text(_NOTIFY_HOOK.format(out=notified))
            os.chmod(hook, 0o755)
            os.chmod(runtime, 0o755)
            config = _config(agent.pw_name, observer.pw_name, rootonly, named, work, hook)
            with custom_stack(runtime, config) as stack:
                os.chmod(stack.agent, 0o666)  # agents.users still decides who gets in
                os.chmod(stack.operator, 0o666)  # operators/observers still decide who gets in
                yield Lab(stack, agent, observer, groupie, gid, rootonly, named, work, notified, runtime)
        finally:
            for d in (rootonly, named, work, runtime, notified):
                shutil.rmtree(d, ignore_errors=True)
            hook.unlink(missing_ok=True)


def observer_call(lab: Lab, verb: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args or {}, "token": None}
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _OPERATOR_CLIENT],
        input=json.dumps({"socket": lab.stack.operator, "request": request}),
        capture_output=True,
        text=True,
        timeout=60,
        **as_user(lab.observer),
    )
    assert done.returncode == 0, done.stderr
    finals = [r for r in json.loads(done.stdout) if "event" not in r]
    assert len(finals) == 1, done.stdout
    reply: dict[str, Any] = finals[0]
    assert reply["ok"], (verb, reply)
    return reply


def pending_write(lab: Lab, path: Path, content: bytes) -> tuple[subprocess.Popen[str], str, dict[str, Any]]:
    """Start a privileged files_write as the agent; return it once pending, with the operator's entry."""
    request_id = f"fp-{uuid.uuid4()}"
    proc = agent_request(
        lab.stack.agent,
        lab.agent,
        "files_write",
        {"path": str(path), "privileged": True, "content": base64.b64encode(content).decode()},
        request_id=request_id,
    )
    for _ in range(600):
        for entry in lab.stack.native("pending", path=lab.stack.operator)["data"]["pending"]:
            if entry["request_id"] == request_id:
                return proc, request_id, entry
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.1)
        assert proc.poll() is None, replies(proc)
    raise AssertionError("the write never became pending")


def everything_but_the_operator(lab: Lab, request_id: str) -> str:
    """All an observer, the journal, the notify command and the logs hold about the request, as one text."""
    seen = [
        observer_call(lab, "events", {"tail": 200}),
        observer_call(lab, "pending"),
        observer_call(lab, "show", {"ref": request_id}),
        lab.stack.journal_rows(),
    ]
    for _ in range(100):  # the notify command runs beside the decision; wait for its file
        notes = sorted(lab.notified.glob(f"notify-{request_id}.json"))
        if notes:
            break
        subprocess.run(["sleep", "0.1"], check=True)
    seen += [p.read_text() for p in notes]
    assert notes, "the notify command never ran: this test would prove nothing about it"
    seen += [p.read_text(errors="replace") for p in (lab.runtime / "logs").glob("*.log")]
    return json.dumps(seen, default=str)


def settle(lab: Lab, proc: subprocess.Popen[str], request_id: str) -> dict[str, Any]:
    assert lab.stack.native("deny", {"id": request_id, "reason": "test"}, path=lab.stack.operator)["ok"]
    return final(replies(proc))


def test_a_root_only_file_is_not_copied_out_before_approval(lab: Lab) -> None:
    secret = f"ROOTONLY-{secrets.token_hex(8)}"
    target = lab.rootonly / "shadow"
    target.write_text(f"root:{secret}:19000:0:99999:7:::\n")
    os.chmod(target, 0o600)
    proc, request_id, entry = pending_write(lab, target, b"anything\n")
    leaked = everything_but_the_operator(lab, request_id)
    assert secret not in leaked, "the root-only file reached the observer, journal, notify command or logs"
    # No rule names the path: the preview ran as the agent, who cannot read the file.
    assert entry["request"]["preview_as"] == "requester"
    assert entry["request"]["preview_error"]["code"] == "permission_denied", entry["request"]
    assert entry["request"].get("diff") is None
    assert secret not in json.dumps(lab.stack.native("pending", path=lab.stack.operator))
    assert code_of(settle(lab, proc, request_id)) == "denied"
    assert secret in target.read_text()


def test_control_a_named_path_is_previewed_as_root_and_shown_to_operators_only(lab: Lab) -> None:
    secret = f"NAMEDSECRET-{secrets.token_hex(8)}"
    target = lab.named / "app.conf"
    target.write_text(f"password = {secret}\n")
    os.chmod(target, 0o600)
    proc, request_id, entry = pending_write(lab, target, b"password = changed\n")
    # The operator door: the diff, made as root, shows the root-only line being replaced.
    request = entry["request"]
    assert f"-password = {secret}" in request["diff"], request
    assert request["before_sha256"] == hashlib.sha256(f"password = {secret}\n".encode()).hexdigest()
    assert secret in lab.stack.cli("pending").stdout
    assert secret in json.dumps(lab.stack.native("show", {"ref": request_id}, path=lab.stack.operator))
    # Everyone else: the diff's hash and size, never the content.
    leaked = everything_but_the_operator(lab, request_id)
    assert secret not in leaked, "the diff reached the observer, journal, notify command or logs"
    assert request["diff_sha256"] == hashlib.sha256(request["diff"].encode()).hexdigest()
    assert request["diff_bytes"] == len(request["diff"].encode())
    assert request["diff_sha256"] in leaked
    observed = observer_call(lab, "pending")["data"]["pending"]
    mine = [p for p in observed if p["request_id"] == request_id]
    assert mine and "diff" not in mine[0]["request"] and mine[0]["request"]["diff_sha256"] == request["diff_sha256"]
    assert code_of(settle(lab, proc, request_id)) == "denied"


def code_of(reply: dict[str, Any]) -> str | None:
    if not reply.get("ok"):
        return str(reply["error"]["code"])
    error = reply["data"].get("error")
    return None if error is None else str(error["code"])


# --- attack 4: the ACL and attributes of a rewritten file -------------------------------


def _can_read(user: pwd.struct_passwd, path: Path, groups: tuple[int, ...] = ()) -> bool:
    done = subprocess.run(["cat", str(path)], capture_output=True, timeout=30, **as_user(user, list(groups)))
    return done.returncode == 0


def _agent_write(lab: Lab, path: Path, content: bytes) -> dict[str, Any]:
    args = {"path": str(path), "privileged": True, "content": base64.b64encode(content).decode()}
    return final(replies(agent_request(lab.stack.agent, lab.agent, "files_write", args)))


def _getfacl(path: Path) -> str:
    return subprocess.run(
        ["getfacl", "--omit-header", "--numeric", "--absolute-names", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@needs_acl
def test_an_approved_write_keeps_the_acl_that_keeps_the_group_out(lab: Lab) -> None:
    target = lab.work / "db.conf"
    target.write_text("old\n")
    os.chown(target, 0, lab.group)
    os.chmod(target, 0o640)
    subprocess.run(
        ["setfacl", "-m", f"g::---,u:{lab.agent.pw_uid}:r,m::r", str(target)], check=True, capture_output=True
    )
    os.setxattr(target, "user.airlock-origin", b"vendor")
    acl = _getfacl(target)
    assert not _can_read(lab.groupie, target, (lab.group,)) and _can_read(lab.agent, target)
    reply = _agent_write(lab, target, b"new\n")
    assert code_of(reply) is None, reply
    assert target.read_text() == "new\n"
    assert not _can_read(lab.groupie, target, (lab.group,)), "the write widened who may read the file to its group"
    assert _can_read(lab.agent, target)
    assert _getfacl(target) == acl
    assert os.getxattr(target, "user.airlock-origin") == b"vendor"
    st = target.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, lab.group)


def test_control_the_same_mode_without_the_acl_lets_the_group_read(lab: Lab) -> None:
    # What the old write left behind: owner, group and st_mode & 0o777 (0640), no ACL.
    plain = lab.work / "plain.conf"
    plain.write_text("old\n")
    os.chown(plain, 0, lab.group)
    os.chmod(plain, 0o640)
    assert _can_read(lab.groupie, plain, (lab.group,))
    assert code_of(_agent_write(lab, plain, b"new\n")) is None and _can_read(lab.groupie, plain, (lab.group,))


# --- item 10: a binary change is shown as one -----------------------------------------------


def test_a_change_of_non_utf8_bytes_shows_the_operator_a_binary_change(lab: Lab) -> None:
    target = lab.named / "blob.bin"
    target.write_bytes(b"MAGIC\xff\xfe\x00\x01tail")
    proc, request_id, entry = pending_write(lab, target, b"MAGIC\xff\xfd\x00\x01tail")
    diff = entry["request"]["diff"]
    assert "binary change (not UTF-8 text): 13 -> 13 bytes; from byte 6 (0x6), 1 bytes replaced by 1" in diff, diff
    assert "-00000000  4d 41 47 49 43 ff fe 00" in diff and "+00000000  4d 41 47 49 43 ff fd 00" in diff
    printed = lab.stack.cli("pending").stdout
    assert "binary change" in printed and "ff fd 00" in printed
    assert code_of(settle(lab, proc, request_id)) == "denied"
    # Control: the old decoding made both sides the same text (an empty diff for a real change).
    assert target.read_bytes().decode("utf-8", "replace") == b"MAGIC\xff\xfd\x00\x01tail".decode("utf-8", "replace")
