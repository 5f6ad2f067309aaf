"""Passkey approvals (issue 33) on a live stack: approval verifies every assertion itself.

airlock-web is played by a throwaway user named in ``web.user`` that calls
the passkey verbs on operator.sock, exactly as the web process would; the
browser is a software authenticator (tests/softauthn.py: a real P-256 key,
real client data, authenticator data and signatures).  Operators and an
observer are throwaway accounts too.  Each attack has its control: the same
door, the legitimate variant, works.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from secsupport import agent_request, as_user, final, needs_root, red_stack, replies, root_dir, throwaway_user

from softauthn import UP, SoftAuthenticator, b64u
from support import Background, Stack, wait_pending

pytestmark = [needs_root]

ORIGIN = "https://airlock.test:8443"
RP = "airlock.test"

# One request on a socket from a process of ``user``; the final reply.
_CLIENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
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
BROWSER = "a-browser-that-asked"  # the sign-in client airlock-web names (approval/logins.py)


def call_as(socket_path: str, user: pwd.struct_passwd, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args, "token": None}
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _CLIENT],
        input=json.dumps({"socket": socket_path, "request": request}),
        capture_output=True,
        text=True,
        timeout=90,
        **as_user(user),
    )
    assert done.returncode == 0, done.stderr
    finals = [r for r in json.loads(done.stdout) if "event" not in r]
    assert len(finals) == 1, done.stdout
    reply: dict[str, Any] = finals[0]
    return reply


@dataclass
class World:
    stack: Stack
    web: pwd.struct_passwd
    op1: pwd.struct_passwd
    op2: pwd.struct_passwd
    own: pwd.struct_passwd  # an operator who is also an agent
    observer: pwd.struct_passwd
    keys: dict[str, SoftAuthenticator]

    def web_call(self, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        return call_as(self.stack.operator, self.web, verb, args)

    def enroll(self, account: str, by: pwd.struct_passwd | None = None) -> SoftAuthenticator:
        """root (or ``by``) makes a link; the web carries a registration by a new authenticator."""
        args = {"account": account}
        made = (
            call_as(self.stack.operator, by, "passkey.enroll", args)
            if by
            else self.stack.native("passkey.enroll", args, path=self.stack.operator)
        )
        assert made["ok"] is True, made
        auth = SoftAuthenticator(ORIGIN, RP)
        begun = self.web_call("passkey.register_begin", {"token": made["data"]["token"]})
        assert begun["ok"] is True, begun
        done = self.web_call(
            "passkey.register_finish",
            {"token": made["data"]["token"], "credential": auth.register(begun["data"]["options"])},
        )
        assert done["ok"] is True and done["data"]["credential_id"] == auth.id, done
        return auth

    def begin(self, request_id: str, decision: str = "allow", **extra: Any) -> dict[str, Any]:
        begun = self.web_call("passkey.decide_begin", {"id": request_id, "decision": decision} | extra)
        assert begun["ok"] is True, begun
        data: dict[str, Any] = begun["data"]
        return data

    def decide(
        self, request_id: str, begun: dict[str, Any], credential: dict[str, Any], **extra: Any
    ) -> dict[str, Any]:
        args = {"id": request_id, "decision": begun["decision"], "statement": begun["statement"]}
        return self.web_call("passkey.decide", args | extra | {"credential": credential})


QUORUM = (
    "  rules:\n    - name: two-person\n      decision: ask\n      approvals: 2\n"
    "      commands: [[/usr/bin/mkdir, '...']]\n"
)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with contextlib.ExitStack() as stack:
        web, op1, op2, own, observer = (
            stack.enter_context(throwaway_user(p)) for p in ("alweb", "alpka", "alpkb", "alpkc", "alpko")
        )
        config = (
            f"agents:\n  users: [root, {own.pw_name}]\n"
            f"operators:\n  users: [{op1.pw_name}, {op2.pw_name}, {own.pw_name}]\n"
            # The web user holds an operators' group (its own primary group): still it decides nothing.
            f"  groups: [{web.pw_name}]\n"
            f"  observers: {{users: [{observer.pw_name}]}}\n"
            f"web:\n  url: {ORIGIN}/\n  rp_id: {RP}\n  user: {web.pw_name}\n"
            "approval:\n  timeout_seconds: 120\n  allow_self_approval: false\n"
            f"policy:\n  default: ask\n{QUORUM}"
        )
        live = stack.enter_context(red_stack(config))
        os.chmod(live.operator, 0o666)  # the socket unit's mode is not what is tested here; the allow-lists are
        w = World(live, web, op1, op2, own, observer, {})
        for user in (op1, op2, own, observer):
            w.keys[user.pw_name] = w.enroll(user.pw_name)
        yield w


def _job(world: World, name: str) -> tuple[Background, Any]:
    marker = root_dir() / name
    job = Background(world.stack, {"argv": ["touch", str(marker)], "privileged": True})
    wait_pending(world.stack, job.request_id)
    return job, marker


def _refused(reply: dict[str, Any], reason: str) -> None:
    assert reply["ok"] is False, reply
    assert reply["error"]["details"].get("reason") == reason, reply


def _records(world: World, request_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(r["payload"])
        for r in world.stack.journal_rows()
        if r["request_id"] == request_id and r["kind"] == "operator.action"
    ]


# --- enrollment -------------------------------------------------------------------


def test_enrollment_tokens_are_one_time_short_lived_and_only_root_or_the_account_s(world: World) -> None:
    # Another non-root operator cannot make a link for someone else.
    other = call_as(world.stack.operator, world.op2, "passkey.enroll", {"account": world.op1.pw_name})
    _refused(other, "not_yours")
    # Control: the account itself may, and the link works once.
    made = call_as(world.stack.operator, world.op1, "passkey.enroll", {"account": world.op1.pw_name})
    assert made["ok"] is True and made["data"]["url"] == f"{ORIGIN}/enroll/{made['data']['token']}", made
    token = made["data"]["token"]
    auth = SoftAuthenticator(ORIGIN, RP)
    begun = world.web_call("passkey.register_begin", {"token": token})
    assert begun["ok"] is True and begun["data"]["options"]["user"]["name"] == world.op1.pw_name, begun
    done = world.web_call(
        "passkey.register_finish", {"token": token, "credential": auth.register(begun["data"]["options"])}
    )
    assert done["ok"] is True, done
    # Used twice: refused (begin and finish), and nothing more is enrolled.
    _refused(world.web_call("passkey.register_begin", {"token": token}), "token")
    second = SoftAuthenticator(ORIGIN, RP)
    again = world.web_call(
        "passkey.register_finish", {"token": token, "credential": second.register(begun["data"]["options"])}
    )
    _refused(again, "token")
    # A made-up token, and the web user enrolling for anyone: refused.
    _refused(world.web_call("passkey.register_begin", {"token": "x" * 43}), "token")
    _refused(world.web_call("passkey.enroll", {"account": world.op1.pw_name}), "not_yours")
    listed = world.stack.native("passkey.list", {"account": world.op1.pw_name}, path=world.stack.operator)
    ids = {p["credential_id"] for p in listed["data"]["passkeys"]}
    assert auth.id in ids and second.id not in ids


def test_an_expired_enrollment_link_is_refused() -> None:
    with throwaway_user("alwex") as web, throwaway_user("alopx") as op:
        config = (
            f"operators:\n  users: [{op.pw_name}]\nweb:\n  url: {ORIGIN}/\n  user: {web.pw_name}\n"
            "  enroll_minutes: 0.02\n"
        )
        with red_stack(config) as stack:
            os.chmod(stack.operator, 0o666)
            auth = SoftAuthenticator(ORIGIN, RP)
            # Control: a fresh link registers.
            fresh = stack.native("passkey.enroll", {"account": op.pw_name}, path=stack.operator)["data"]
            begun = call_as(stack.operator, web, "passkey.register_begin", {"token": fresh["token"]})
            assert begun["ok"] is True, begun
            stale = stack.native("passkey.enroll", {"account": op.pw_name}, path=stack.operator)["data"]
            late = call_as(stack.operator, web, "passkey.register_begin", {"token": stale["token"]})
            while late["ok"] and time.time() <= stale["expires"] + 1:  # the link's own expiry, not a guess
                time.sleep(0.2)
                late = call_as(stack.operator, web, "passkey.register_begin", {"token": stale["token"]})
            _refused(late, "token")
            done = call_as(
                stack.operator,
                web,
                "passkey.register_finish",
                {"token": fresh["token"], "credential": auth.register(begun["data"]["options"])},
            )
            _refused(done, "token")  # it expired too while we waited: a late registration is refused


def test_sign_in_says_who_and_as_what(world: World) -> None:
    for user, role in ((world.op1, "operator"), (world.observer, "observer")):
        begun = world.web_call("passkey.login_begin", {"client": BROWSER})["data"]
        auth = world.keys[user.pw_name]
        done = world.web_call(
            "passkey.login_finish",
            {
                "challenge_id": begun["challenge_id"],
                "credential": auth.sign(begun["options"]["challenge"]),
                "client": BROWSER,
            },
        )
        session = done["data"].pop("session", "")
        assert (
            done["ok"] is True
            and done["data"].pop("expires") > 0
            and done["data"]
            == {
                "account": user.pw_name,
                "role": role,
                "credential_id": auth.id,
            }
        ), done
        # The console session it opened is approval's: airlock-web asks about it on every request.
        live = world.web_call("passkey.session", {"session": session})
        assert live["ok"] is True and live["data"]["account"] == user.pw_name, live
        # The challenge is spent: the same sign-in again is refused.
        replay = world.web_call(
            "passkey.login_finish",
            {
                "challenge_id": begun["challenge_id"],
                "credential": auth.sign(begun["options"]["challenge"]),
                "client": BROWSER,
            },
        )
        _refused(replay, "challenge")


# --- deciding ---------------------------------------------------------------------


def test_an_assertion_for_one_request_is_refused_on_another_and_replays_are_refused(world: World) -> None:
    a, a_marker = _job(world, "a")
    b, b_marker = _job(world, "b")
    auth = world.keys[world.op1.pw_name]
    for_a = world.begin(a.request_id)
    signed_a = auth.sign(for_a["challenge"])
    on_b = world.decide(b.request_id, world.begin(b.request_id), signed_a)
    _refused(on_b, "challenge")
    assert wait_pending(world.stack, b.request_id) and not b_marker.exists()
    # Control: on A it approves, and the agent's command runs.
    ok = world.decide(a.request_id, for_a, signed_a)
    assert ok["ok"] is True and ok["data"]["by"]["user"] == world.op1.pw_name, ok
    assert a.result()["ok"] is True and a_marker.exists()
    # The same assertion again: A is no longer pending, B's challenge is another.
    replay = world.decide(a.request_id, for_a, signed_a)
    assert replay["ok"] is False and replay["error"]["code"] == "not_found", replay
    _refused(world.decide(b.request_id, world.begin(b.request_id), signed_a), "challenge")
    approved = [r for r in _records(world, a.request_id) if r["action"] == "approve"]
    assert approved[-1]["method"] == "passkey" and approved[-1]["credential_id"] == auth.id
    assert approved[-1]["operator"] == world.op1.pw_name and approved[-1]["carrier"]["user"] == world.web.pw_name
    # B: deny with a reason, by op2 (control for the deny path).
    for_b = world.begin(b.request_id, "deny", reason="not today")
    denied = world.decide(
        b.request_id, for_b, world.keys[world.op2.pw_name].sign(for_b["challenge"]), reason="not today"
    )
    assert denied["ok"] is True and denied["data"]["decision"] == "deny", denied
    assert b.result()["ok"] is False and not b_marker.exists()


def test_a_changed_challenge_origin_rp_id_or_missing_uv_is_refused(world: World) -> None:
    job, marker = _job(world, "bent")
    auth = world.keys[world.op2.pw_name]
    login = world.web_call("passkey.login_begin", {"client": BROWSER})["data"]
    signed_in = world.web_call(
        "passkey.login_finish",
        {
            "challenge_id": login["challenge_id"],
            "credential": auth.sign(login["options"]["challenge"]),
            "client": BROWSER,
        },
    )
    assert signed_in["ok"] is True, signed_in
    stored = auth.counter  # what approval now keeps for this credential
    begun = world.begin(job.request_id)
    cases = [
        (auth.sign(b64u(os.urandom(32))), "challenge"),
        (auth.sign(begun["challenge"], origin="https://evil.example"), "origin"),
        (auth.sign(begun["challenge"], rp_id="evil.example"), "rp_id"),
        (auth.sign(begun["challenge"], flags=UP), "user_verification"),
    ]
    for credential, reason in cases:
        _refused(world.decide(job.request_id, begun, credential), reason)
    # The reason is part of the challenge: an assertion over no reason does not carry one added later.
    _refused(world.decide(job.request_id, begun, auth.sign(begun["challenge"]), reason="added by the web"), "challenge")
    # A counter that does not grow is a clone or a replay.
    newest, auth.counter = auth.counter, stored
    _refused(world.decide(job.request_id, begun, auth.sign(begun["challenge"], count=False)), "counter")
    auth.counter = newest
    # A statement that is not the current one.
    stale = world.decide(job.request_id, begun | {"statement": begun["statement"] + " "}, auth.sign(begun["challenge"]))
    assert stale["ok"] is False and stale["error"]["details"]["reason"] == "request_changed", stale
    assert wait_pending(world.stack, job.request_id) and not marker.exists()
    refused = [r for r in _records(world, job.request_id) if r["action"] == "passkey.refused"]
    assert len(refused) == 7 and all(r["carrier"]["user"] == world.web.pw_name for r in refused)
    # Control: a proper assertion approves.
    ok = world.decide(job.request_id, begun, auth.sign(begun["challenge"]))
    assert ok["ok"] is True, ok
    assert job.result()["ok"] is True and marker.exists()


def test_unenrolled_and_revoked_passkeys_decide_nothing(world: World) -> None:
    job, marker = _job(world, "unknown")
    begun = world.begin(job.request_id)
    stranger = SoftAuthenticator(ORIGIN, RP)
    _refused(world.decide(job.request_id, begun, stranger.sign(begun["challenge"])), "unknown_credential")
    spare = world.enroll(world.op2.pw_name)
    # Control: the spare key signs in before it is revoked.
    login = world.web_call("passkey.login_begin", {"client": BROWSER})["data"]
    signed_in = world.web_call(
        "passkey.login_finish",
        {
            "challenge_id": login["challenge_id"],
            "credential": spare.sign(login["options"]["challenge"]),
            "client": BROWSER,
        },
    )
    assert signed_in["ok"] is True, signed_in
    # op1 may not revoke op2's passkey; op2 may.
    _refused(call_as(world.stack.operator, world.op1, "passkey.revoke", {"credential_id": spare.id}), "not_yours")
    revoked = call_as(world.stack.operator, world.op2, "passkey.revoke", {"credential_id": spare.id})
    assert revoked["ok"] is True, revoked
    _refused(world.decide(job.request_id, begun, spare.sign(begun["challenge"])), "revoked")
    assert wait_pending(world.stack, job.request_id) and not marker.exists()
    ok = world.decide(job.request_id, begun, world.keys[world.op2.pw_name].sign(begun["challenge"]))
    assert ok["ok"] is True, ok
    assert job.result()["ok"] is True and marker.exists()


def test_the_requester_s_passkey_and_an_observer_s_decide_nothing(world: World) -> None:
    marker = root_dir() / "own"
    rid = f"own-{uuid.uuid4().hex[:8]}"
    args = {"argv": ["/usr/bin/touch", str(marker)], "privileged": True, "operation_id": f"op-{uuid.uuid4()}"}
    job = agent_request(world.stack.agent, world.own, "exec", args, request_id=rid)
    wait_pending(world.stack, rid)
    begun = world.begin(rid)
    _refused(world.decide(rid, begun, world.keys[world.own.pw_name].sign(begun["challenge"])), "self_approval")
    _refused(world.decide(rid, begun, world.keys[world.observer.pw_name].sign(begun["challenge"])), "not_operator")
    assert wait_pending(world.stack, rid) and not marker.exists()
    # Control: another operator's passkey approves it.
    ok = world.decide(rid, begun, world.keys[world.op1.pw_name].sign(begun["challenge"]))
    assert ok["ok"] is True, ok
    assert final(replies(job))["ok"] is True and marker.exists()


def test_the_web_user_cannot_decide_without_an_assertion(world: World) -> None:
    job, marker = _job(world, "forged")
    plain = world.web_call("approve", {"id": job.request_id})
    assert plain["ok"] is False and plain["error"]["code"] == "unauthorized", plain
    begun = world.begin(job.request_id)
    for forged in (None, {}, {"id": "AA", "rawId": "AA", "type": "public-key", "response": {}}):
        reply = world.decide(job.request_id, begun, forged)  # type: ignore[arg-type]
        assert reply["ok"] is False and reply["error"]["code"] in ("invalid_arguments", "unauthorized"), reply
    # Claiming a credential ID with a signature made by another key.
    forger = SoftAuthenticator(ORIGIN, RP)
    claimed = forger.sign(begun["challenge"]) | {
        "id": world.keys[world.op1.pw_name].id,
        "rawId": world.keys[world.op1.pw_name].id,
    }
    _refused(world.decide(job.request_id, begun, claimed), "signature")
    for verb in ("hold", "cancel", "grant.revoke", "token.issue"):
        assert world.web_call(verb, {})["error"]["code"] == "unauthorized"
    _refused(world.web_call("passkey.list", {}), "not_yours")
    _refused(world.web_call("passkey.revoke", {"credential_id": world.keys[world.op1.pw_name].id}), "not_yours")
    assert wait_pending(world.stack, job.request_id) and not marker.exists()
    # Control: a real assertion carried by the same web user approves.
    ok = world.decide(job.request_id, begun, world.keys[world.op1.pw_name].sign(begun["challenge"]))
    assert ok["ok"] is True, ok
    assert job.result()["ok"] is True and marker.exists()


def test_two_passkeys_of_one_person_count_once_in_a_two_person_rule(world: World) -> None:
    second_key = world.enroll(world.op1.pw_name)
    marker = root_dir() / "quorum"
    job = Background(world.stack, {"argv": ["mkdir", str(marker)], "privileged": True})
    wait_pending(world.stack, job.request_id)
    begun = world.begin(job.request_id)
    first = world.decide(job.request_id, begun, world.keys[world.op1.pw_name].sign(begun["challenge"]))
    assert first["ok"] is True and first["data"]["complete"] is False, first
    again = world.decide(job.request_id, begun, second_key.sign(begun["challenge"]))
    assert again["ok"] is False and "same person" in again["error"]["message"], again
    # The same assertion once more is a replay.
    assert wait_pending(world.stack, job.request_id)["quorum"]["progress"] == "1 of 2" and not marker.exists()
    # Control: a second person completes the quorum.
    done = world.decide(job.request_id, begun, world.keys[world.op2.pw_name].sign(begun["challenge"]))
    assert done["ok"] is True and done["data"]["complete"] is True, done
    assert job.result()["ok"] is True and marker.exists()


def test_a_replayed_assertion_is_refused_within_a_quorum(world: World) -> None:
    marker = root_dir() / "replayed"
    job = Background(world.stack, {"argv": ["mkdir", str(marker)], "privileged": True})
    wait_pending(world.stack, job.request_id)
    begun = world.begin(job.request_id)
    signed = world.keys[world.op2.pw_name].sign(begun["challenge"])
    assert world.decide(job.request_id, begun, signed)["ok"] is True
    _refused(world.decide(job.request_id, begun, signed), "replayed")
    done = world.decide(job.request_id, begun, world.keys[world.op1.pw_name].sign(begun["challenge"]))
    assert done["ok"] is True and done["data"]["complete"] is True, done
    assert job.result()["ok"] is True and marker.exists()


def test_the_enroll_command_prints_the_link_and_waits_for_the_registration(world: World) -> None:
    import sys

    environ = dict(os.environ) | {"AIRLOCK_OPERATOR_SOCKET": world.stack.operator}
    proc = subprocess.Popen(
        [sys.executable, "-m", "airlock", "passkey", "enroll", world.op2.pw_name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith(f"{ORIGIN}/enroll/"), url
        token = url.rsplit("/", 1)[1]
        auth = SoftAuthenticator(ORIGIN, RP)
        begun = world.web_call("passkey.register_begin", {"token": token})
        done = world.web_call(
            "passkey.register_finish", {"token": token, "credential": auth.register(begun["data"]["options"])}
        )
        assert done["ok"] is True, done
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"enrolled passkey {auth.id} for {world.op2.pw_name}" in out
    listed = world.stack.cli("passkey", "list", world.op2.pw_name)
    assert auth.id in listed.stdout and "in use" in listed.stdout, listed
    revoked = world.stack.cli("passkey", "revoke", auth.id, "--reason", "lost phone")
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in world.stack.cli("passkey", "list", world.op2.pw_name).stdout


def test_after_a_restart_old_assertions_and_old_counters_are_refused(world: World) -> None:
    auth = world.keys[world.op1.pw_name]
    first, _first_marker = _job(world, "before-restart")
    before = world.begin(first.request_id)
    kept = auth.sign(before["challenge"])  # made, never submitted
    used = world.decide(first.request_id, before, auth.sign(before["challenge"]))  # control: this one counts
    assert used["ok"] is True, used
    assert first.result()["ok"] is True
    stale_counter = auth.counter
    world.stack.kill_service("approval")
    job, marker = _job(world, "after-restart")
    begun = world.begin(job.request_id)
    # An assertion over a statement of before the restart verifies over nothing pending now.
    _refused(world.decide(job.request_id, begun, kept), "challenge")
    old = world.decide(job.request_id, before, kept)
    assert old["ok"] is False and old["error"]["code"] in ("not_found", "conflict"), old
    # The counter approval kept before the restart still stands: an equal one is refused.
    newest, auth.counter = auth.counter, stale_counter
    _refused(world.decide(job.request_id, begun, auth.sign(begun["challenge"], count=False)), "counter")
    auth.counter = newest
    ok = world.decide(job.request_id, begun, auth.sign(begun["challenge"]))
    assert ok["ok"] is True, ok
    assert job.result()["ok"] is True and marker.exists()


def test_a_passkey_approval_may_carry_a_grant_the_challenge_covers(world: World) -> None:
    marker = root_dir() / "granted"
    argv = ["touch", str(marker)]
    job = Background(world.stack, {"argv": argv, "privileged": True})
    wait_pending(world.stack, job.request_id)
    begun = world.begin(job.request_id, grant_seconds=300)
    auth = world.keys[world.op2.pw_name]
    # The grant is part of the challenge: dropping it, or changing it, is another challenge.
    _refused(world.decide(job.request_id, begun, auth.sign(begun["challenge"])), "challenge")
    _refused(world.decide(job.request_id, begun, auth.sign(begun["challenge"]), grant_seconds=3000), "challenge")
    # The carrier adds a field the passkey never signed (uses): the grant is made from the signed ones only.
    ok = world.decide(job.request_id, begun, auth.sign(begun["challenge"]), grant_seconds=300, uses=1)
    assert ok["ok"] is True and ok["data"]["grant"]["made_by"] == world.op2.pw_name, ok
    assert ok["data"]["grant"].get("uses") is None, ok
    assert job.result()["ok"] is True
    again = world.stack.exec({"argv": argv, "privileged": True, "operation_id": f"op-{uuid.uuid4()}"})
    assert again["ok"] is True, again  # the grant let it through without asking
    revoked = world.stack.native(
        "grant.revoke", {"grant_id": ok["data"]["grant"]["grant_id"]}, path=world.stack.operator
    )
    assert revoked["ok"] is True, revoked
