"""An approval is one person's (issue 27, items 1, 2, 7 and 8), on a live stack with throwaway users.

Each operator is a real Unix account with a real ed25519 key; the
allowed_signers principal maps to the account (``approval.signer_accounts``).

- Attack 1: one operator meets a two-person rule alone, by approving once by
  uid and once with their own key.  Refused: it is the same person.
- Attack 2: an operator who is also an agent approves their own root job with
  their own key (on the operator door, and carried on the agent door).
  Refused as self-approval.
- Attack 7: agent B holds request ID X; agent A's request X must neither fail
  nor tell A anything, and each agent's withdrawal touches its own only.
- Attack 8: agent B floods ``approve_signed`` with junk for A's request ID:
  B is told ``not_found``, nothing lands in A's story, and B is rate-limited.
  A signature an agent carries is journaled with the carrier apart from the
  signer, and the agent's reason is not the approver's.

Every test has its control: the legitimate variant (a second person, another
person's key, the qualified reference, the agent's own request) goes through
the same doors and works.
"""

from __future__ import annotations

import contextlib
import json
import pwd
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_request, as_user, final, needs_root, red_stack, replies, root_dir, throwaway_user

from support import Background, Stack, wait_pending

pytestmark = [
    needs_root,
    pytest.mark.skipif(
        subprocess.run(["which", "ssh-keygen"], capture_output=True).returncode != 0,
        reason="ssh-keygen is not installed (openssh-client)",
    ),
]

# One request on a socket from a process of ``user``, exactly as given (no time added); the final reply.
_CLIENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
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


def call_as(socket_path: str, user: pwd.struct_passwd, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args, "token": None}
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _CLIENT],
        input=json.dumps({"socket": socket_path, "request": request}),
        capture_output=True,
        text=True,
        timeout=60,
        **as_user(user),
    )
    assert done.returncode == 0, done.stderr
    finals = [r for r in json.loads(done.stdout) if "event" not in r]
    assert len(finals) == 1, done.stdout
    reply: dict[str, Any] = finals[0]
    return reply


@contextlib.contextmanager
def persons(*prefixes: str) -> Iterator[list[pwd.struct_passwd]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(throwaway_user(p)) for p in prefixes]


def make_keys(folder: Path, users: list[pwd.struct_passwd]) -> Path:
    """One ed25519 key per user, principal ``<user>@example.org``; the allowed_signers file."""
    lines = []
    for user in users:
        key = folder / user.pw_name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        pub = (folder / f"{user.pw_name}.pub").read_text().split()
        lines.append(f"{user.pw_name}@example.org {pub[0]} {pub[1]}")
    allowed = folder / "allowed_signers"
    allowed.write_text("\n".join(lines) + "\n")
    return allowed


def sign(folder: Path, user: pwd.struct_passwd, text: str) -> str:
    return subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-n", "airlock-approval", "-f", str(folder / user.pw_name)],
        input=text.encode(),
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()


def config(
    allowed: Path, operators: list[pwd.struct_passwd], agents: Sequence[pwd.struct_passwd] = (), rules: str = ""
) -> str:
    """Operators (each key mapped to its account), agents (and root, the test's own requests); no self-approval."""
    names = ", ".join(u.pw_name for u in operators)
    mapping = ", ".join(f"{u.pw_name}@example.org: {u.pw_name}" for u in operators)
    agent_names = ", ".join(["root", *(u.pw_name for u in agents)])
    return (
        f"agents:\n  users: [{agent_names}]\noperators:\n  users: [{names}]\n"
        f"approval:\n  timeout_seconds: 60\n  allow_self_approval: false\n  allowed_signers: {allowed}\n"
        f"  signer_accounts: {{{mapping}}}\npolicy:\n  default: ask\n{rules}"
    )


def statement(stack: Stack, request_id: str) -> str:
    text: str = stack.native("statement", {"id": request_id}, path=stack.operator)["data"]["statement"]
    return text


def records(stack: Stack, request_id: str, kind: str) -> list[dict[str, Any]]:
    return [
        json.loads(r["payload"]) | {"_peer_uid": r["peer_uid"]}
        for r in stack.journal_rows()
        if r["request_id"] == request_id and r["kind"] == kind
    ]


def exec_as(stack: Stack, user: pwd.struct_passwd, argv: list[str], request_id: str) -> subprocess.Popen[str]:
    args = {"argv": argv, "privileged": True, "operation_id": f"op-{uuid.uuid4()}"}
    return agent_request(stack.agent, user, "exec", args, request_id=request_id)


def pending_of(stack: Stack, request_id: str, count: int, timeout: float = 15) -> list[dict[str, Any]]:
    """The pending entries with ``request_id``, once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = [
            p for p in stack.native("pending", path=stack.operator)["data"]["pending"] if p["request_id"] == request_id
        ]
        if len(found) == count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{request_id}: {len(found)} pending, not {count}")


# --- attack 1: one person, one vote ------------------------------------------------

TWO_PERSON = (
    "  rules:\n    - name: two-person\n      decision: ask\n      approvals: 2\n"
    "      commands: [[/usr/bin/touch, '...']]\n"
)


def test_one_operator_cannot_meet_a_two_person_rule_alone(tmp_path: Path) -> None:
    with persons("alop", "alopb") as (op, op2):
        allowed = make_keys(tmp_path, [op, op2])
        with red_stack(config(allowed, [op, op2], rules=TWO_PERSON)) as stack:
            stack_operator_open(stack)
            marker = root_dir() / "two-person"
            job = Background(stack, {"argv": ["touch", str(marker)], "privileged": True})
            wait_pending(stack, job.request_id)
            text = statement(stack, job.request_id)
            by_uid = call_as(stack.operator, op, "approve", {"id": job.request_id})
            assert by_uid["ok"] is True and by_uid["data"]["complete"] is False, by_uid
            # The same person again, by key: on the operator door, and carried by the requesting agent.
            own_key = sign(tmp_path, op, text)
            by_key = call_as(stack.operator, op, "approve", {"id": job.request_id, "signature": own_key})
            assert by_key["ok"] is False and "same person" in by_key["error"]["message"], by_key
            carried = stack.native("approve_signed", {"request_id": job.request_id, "signature": own_key})
            assert carried["ok"] is False and "same person" in carried["error"]["message"], carried
            shown = wait_pending(stack, job.request_id)
            assert shown["quorum"]["progress"] == "1 of 2" and not marker.exists()
            assert [a["user"] for a in shown["quorum"]["approvers"]] == [op.pw_name]
            listed = stack.cli("show", job.request_id).stdout
            assert f"approvals: 1 of 2 ({op.pw_name})" in listed, listed
            # Control: a second person's key completes the quorum through the same door.
            second = call_as(
                stack.operator, op2, "approve", {"id": job.request_id, "signature": sign(tmp_path, op2, text)}
            )
            assert second["ok"] is True and second["data"]["complete"] is True, second
            assert job.result()["ok"] is True and marker.exists()
            decided = records(stack, job.request_id, "approval.decided")[-1]
            assert [a["user"] for a in decided["approvers"]] == [op.pw_name, op2.pw_name]
            assert [a.get("principal") for a in decided["approvers"]] == [None, f"{op2.pw_name}@example.org"]


def stack_operator_open(stack: Stack) -> None:
    import os

    os.chmod(stack.operator, 0o666)  # the socket unit's mode is not what is tested here; operators.users is


# --- attack 2: a signed vote by the requester's own account is self-approval ------------


def test_an_operator_cannot_approve_their_own_request_with_their_own_key(tmp_path: Path) -> None:
    with persons("alself", "alother") as (op, op2):
        allowed = make_keys(tmp_path, [op, op2])
        with red_stack(config(allowed, [op, op2], [op])) as stack:  # allow_self_approval: false
            stack_operator_open(stack)
            marker = root_dir() / "self-approved"
            rid = f"self-{secrets.token_hex(4)}"
            job = exec_as(stack, op, ["/usr/bin/touch", str(marker)], rid)  # op is also an agent
            wait_pending(stack, rid)
            text = statement(stack, rid)
            own_key = sign(tmp_path, op, text)
            on_operator_door = call_as(stack.operator, op, "approve", {"id": rid, "signature": own_key})
            assert on_operator_door["error"]["code"] == "unauthorized", on_operator_door
            carried = call_as(stack.agent, op, "approve_signed", {"request_id": rid, "signature": own_key})
            assert carried["error"]["code"] == "unauthorized", carried
            # Submitted by another operator, it is still op's key: still op's own request.
            relayed = call_as(stack.operator, op2, "approve", {"id": rid, "signature": own_key})
            assert relayed["error"]["code"] == "unauthorized", relayed
            assert wait_pending(stack, rid) and not marker.exists()
            refused = [r for r in records(stack, rid, "operator.action") if r["action"] == "signature.refused"]
            assert [r["code"] for r in refused] == ["unauthorized"] * 3
            # Control: another person's key, carried by the same agent, approves it.
            ok = call_as(stack.agent, op, "approve_signed", {"request_id": rid, "signature": sign(tmp_path, op2, text)})
            assert ok["ok"] is True, ok
            assert final(replies(job))["ok"] is True and marker.exists()


# --- attack 7: request IDs are each agent's own ------------------------------------------


def test_two_agents_may_use_the_same_request_id_and_each_sees_only_its_own(tmp_path: Path) -> None:
    with persons("alaga", "alagb") as (a, b):
        agents = f"agents:\n  users: [{a.pw_name}, {b.pw_name}]\n"
        with red_stack(agents + "approval:\n  timeout_seconds: 60\npolicy:\n  default: ask\n") as stack:
            folder = root_dir()
            rid = f"deploy-{secrets.token_hex(4)}"
            b_job = exec_as(stack, b, ["/usr/bin/touch", str(folder / "b")], rid)
            pending_of(stack, rid, 1)
            a_job = exec_as(stack, a, ["/usr/bin/touch", str(folder / "a")], rid)
            both = pending_of(stack, rid, 2)  # before the fix: A's request failed at once with conflict
            assert {p["peer"]["uid"] for p in both} == {a.pw_uid, b.pw_uid}
            # A bare ID no longer names one request: the operator is told whose they are.
            bare = stack.native("approve", {"id": rid}, path=stack.operator)
            assert bare["ok"] is False and bare["error"]["code"] == "conflict", bare
            assert sorted(bare["error"]["details"]["references"]) == sorted(
                [f"{a.pw_name}/{rid}", f"{b.pw_name}/{rid}"]
            )
            # B's lookups by ID are B's own: a signature B carries for rid is checked against B's request.
            probe = call_as(stack.agent, b, "approve_signed", {"request_id": rid, "signature": "junk"})
            assert probe["error"]["code"] == "signature_invalid", probe
            refused = [r for r in records(stack, rid, "operator.action") if r["action"] == "signature.refused"]
            assert [r["carrier"]["uid"] for r in refused] == [b.pw_uid]
            # A hangs up: A's request is withdrawn, B's stays pending.
            a_job.kill()
            a_job.wait(10)
            pending_of(stack, rid, 1)
            assert pending_of(stack, rid, 1)[0]["peer"]["uid"] == b.pw_uid
            # Control: the qualified reference approves exactly B's request.
            ok = stack.native("approve", {"id": f"{b.pw_name}/{rid}"}, path=stack.operator)
            assert ok["ok"] is True, ok
            assert final(replies(b_job))["ok"] is True
            assert (folder / "b").exists() and not (folder / "a").exists()
            decided = records(stack, rid, "approval.decided")
            assert sorted((d["_peer_uid"], d["decision"]) for d in decided) == sorted(
                [(a.pw_uid, "withdrawn"), (b.pw_uid, "allow")]
            )
            # Settled, the ID still names two stories: show refuses the bare ID and tells each apart.
            shown = stack.native("show", {"ref": rid}, path=stack.operator)
            assert shown["ok"] is False and "2 agents" in shown["error"]["message"], shown
            mine = stack.native("show", {"ref": f"{b.pw_name}/{rid}"}, path=stack.operator)["data"]
            theirs = stack.native("show", {"ref": f"{a.pw_uid}/{rid}"}, path=stack.operator)["data"]
            assert mine["peer"]["uid"] == b.pw_uid and mine["decision"]["decision"] == "allow", mine
            assert theirs["peer"]["uid"] == a.pw_uid and theirs["decision"]["decision"] == "withdrawn", theirs


def test_two_agents_one_id_each_approve_line_decides_its_own_request() -> None:
    """Exact references over (uid, ID) keys: the --expect of each approve line picks that agent's request."""
    with persons("alexa", "alexb") as (a, b):
        agents = f"agents:\n  users: [{a.pw_name}, {b.pw_name}]\n"
        with red_stack(agents + "approval:\n  timeout_seconds: 60\npolicy:\n  default: ask\n") as stack:
            folder = root_dir()
            rid = f"deploy-{secrets.token_hex(4)}"
            a_job = exec_as(stack, a, ["/usr/bin/touch", str(folder / "a")], rid)
            pending_of(stack, rid, 1)
            b_job = exec_as(stack, b, ["/usr/bin/touch", str(folder / "b")], rid)
            expect = {p["peer"]["uid"]: p["expect"] for p in pending_of(stack, rid, 2)}
            assert len(set(expect.values())) == 2, expect  # each pending request has its own digest
            bare = stack.native("approve", {"id": rid}, path=stack.operator)
            assert bare["ok"] is False and bare["error"]["code"] == "conflict", bare
            assert {o["uid"]: o["expect"] for o in bare["error"]["details"]["owners"]} == expect
            # A's approve line (as `airlock pending` prints it) approves A's request only.
            ok = stack.native("approve", {"id": rid, "expect": expect[a.pw_uid]}, path=stack.operator)
            assert ok["ok"] is True, ok
            assert final(replies(a_job))["ok"] is True and (folder / "a").exists()
            assert [p["peer"]["uid"] for p in pending_of(stack, rid, 1)] == [b.pw_uid]
            # B's request named by agent with A's digest: not the request the line was made for.
            crossed = stack.native(
                "approve", {"id": f"{b.pw_name}/{rid}", "expect": expect[a.pw_uid]}, path=stack.operator
            )
            assert crossed["ok"] is False and crossed["error"]["details"].get("reason") == "request_changed", crossed
            assert not (folder / "b").exists()
            # Control: B's own line (by uid, with B's digest) approves B's request.
            ok = stack.native("approve", {"id": f"{b.pw_uid}/{rid}", "expect": expect[b.pw_uid]}, path=stack.operator)
            assert ok["ok"] is True, ok
            assert final(replies(b_job))["ok"] is True and (folder / "b").exists()
            refused = [r for r in records(stack, rid, "operator.action") if r["action"] == "refused"]
            assert [(r["code"], r["agent_uid"]) for r in refused] == [("request_changed", b.pw_uid)], refused


# --- attack 8: approve_signed is attributed to its carrier, and bounded ----------------------


def test_another_agents_request_gets_not_found_and_a_flood_is_rate_limited(tmp_path: Path) -> None:
    with persons("alvic", "alatt", "alsig") as (victim, attacker, op):
        allowed = make_keys(tmp_path, [op])
        with red_stack(config(allowed, [op], [victim, attacker])) as stack:
            marker = root_dir() / "victim"
            rid = f"victim-{secrets.token_hex(4)}"
            job = exec_as(stack, victim, ["/usr/bin/touch", str(marker)], rid)
            wait_pending(stack, rid)
            codes = [
                call_as(stack.agent, attacker, "approve_signed", {"request_id": rid, "signature": "junk"})["error"][
                    "code"
                ]
                for _ in range(8)
            ]
            assert codes == ["not_found"] * 5 + ["rate_limited"] * 3, codes
            assert not [r for r in records(stack, rid, "operator.action") if r["action"] == "signature.refused"]
            # Control: the victim's own junk is journaled, attributed to the victim (the attacker's
            # limit is not the victim's).
            own = call_as(stack.agent, victim, "approve_signed", {"request_id": rid, "signature": "junk"})
            assert own["error"]["code"] == "signature_invalid", own
            text = statement(stack, rid)
            bad = sign(tmp_path, op, text.replace("touch", "touch "))
            refused = call_as(stack.agent, victim, "approve_signed", {"request_id": rid, "signature": bad})
            assert refused["error"]["code"] == "signature_invalid", refused
            journaled = [r for r in records(stack, rid, "operator.action") if r["action"] == "signature.refused"]
            assert journaled and all(r["_peer_uid"] == victim.pw_uid for r in journaled)
            assert journaled[-1]["carrier"] == {"uid": victim.pw_uid, "user": victim.pw_name}
            # A signature the agent carries: the carrier and its reason apart from the signer's.
            carried = call_as(
                stack.agent,
                victim,
                "approve_signed",
                {"request_id": rid, "signature": sign(tmp_path, op, text), "reason": "the agent says it is fine"},
            )
            assert carried["ok"] is True, carried
            assert final(replies(job))["ok"] is True and marker.exists()
            approve = [r for r in records(stack, rid, "operator.action") if r["action"] == "approve"][-1]
            assert approve["_peer_uid"] == victim.pw_uid
            assert approve["carrier"] == {"uid": victim.pw_uid, "user": victim.pw_name}
            assert approve["carrier_reason"] == "the agent says it is fine" and approve["reason"] == ""
            assert approve["operator"] == op.pw_name and approve["operator_uid"] == op.pw_uid
            decided = records(stack, rid, "approval.decided")[-1]
            assert decided["reason"] == "" and decided["operator_uid"] == op.pw_uid
            assert decided["approvers"][0]["carrier"] == {"uid": victim.pw_uid, "user": victim.pw_name}
