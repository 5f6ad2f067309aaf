"""One touch, many hosts (issue 49) on three live stacks: each host verifies the group assertion itself.

Three `airlock dev up` stacks stand for three hosts (distinct runtime dirs,
one configuration: the same console origin, the same operator, one passkey
enrolled on each, as `airlock passkey import` would list it).  The fleet
console is played by the web user calling ``passkey.decide`` with a
``group`` on each host's operator.sock, as the console's SSH login does;
the authenticator is tests/softauthn.py.  A compromised console alters a
host's statement, drops a host from the list, slips another request in,
replays the assertion, presents it as a sign-in or for the other verdict:
nothing is approved.  Each attack has its control.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from secsupport import needs_root, red_stack, root_dir, throwaway_user
from test_sec_passkeys import BROWSER, ORIGIN, RP, call_as

from airlock.approval import webauthn
from airlock.approval.statement import Statement, parse
from airlock.common import groups

from softauthn import SoftAuthenticator, b64u
from support import Background, Stack, wait_pending

pytestmark = [needs_root]


@dataclass
class Host:
    stack: Stack
    web: pwd.struct_passwd

    def call(self, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        return call_as(self.stack.operator, self.web, verb, args)

    def ask(self, argv: list[str], **more: Any) -> tuple[Background, Statement]:
        """An agent's request pending here, and its allow statement as the host publishes it."""
        job = Background(self.stack, {"argv": argv, "privileged": True} | more)
        wait_pending(self.stack, job.request_id)
        return job, self.statement(job.request_id)

    def statement(self, request_id: str, decision: str = "allow") -> Statement:
        begun = self.call("passkey.decide_begin", {"id": request_id, "decision": decision})
        assert begun["ok"] is True, begun
        return parse(begun["data"]["statement"])

    def decide(self, statement: Statement, group: dict[str, Any], credential: dict[str, Any]) -> dict[str, Any]:
        args = {"id": statement.request, "decision": statement.decision, "statement": statement.render()}
        return self.call("passkey.decide", args | {"group": group, "credential": credential})


@dataclass
class Fleet:
    hosts: list[Host]
    operator: pwd.struct_passwd
    key: SoftAuthenticator
    login: pwd.struct_passwd  # what the fleet console logs in as on each host (operators.observers)

    def touch(self, group: groups.Group, extras: bytes = webauthn.extras("", None, None)) -> dict[str, Any]:
        """One touch over the group: the assertion the console carries to every host."""
        return self.key.sign(b64u(groups.challenge(group, extras)))


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with contextlib.ExitStack() as stack:
        web = stack.enter_context(throwaway_user("alfwb"))
        op = stack.enter_context(throwaway_user("alfop"))
        login = stack.enter_context(throwaway_user("alfsh"))  # the bastion's SSH login: an observer
        config = (
            f"operators:\n  users: [{op.pw_name}]\n  observers: {{users: [{login.pw_name}]}}\n"
            f"web:\n  url: {ORIGIN}/\n  rp_id: {RP}\n  user: {web.pw_name}\n"
            "approval:\n  timeout_seconds: 300\npolicy:\n  default: ask\n"
        )
        key = SoftAuthenticator(ORIGIN, RP)
        hosts = []
        for _ in range(3):
            live = stack.enter_context(red_stack(config))
            os.chmod(live.operator, 0o666)  # the allow-lists are what is tested, not the socket's mode
            host = Host(live, web)
            made = live.native("passkey.enroll", {"account": op.pw_name}, path=live.operator)["data"]
            begun = host.call("passkey.register_begin", {"token": made["token"]})
            done = host.call(
                "passkey.register_finish",
                {"token": made["token"], "credential": key.register(begun["data"]["options"])},
            )
            assert done["ok"] is True and done["data"]["credential_id"] == key.id, done
            hosts.append(host)
        yield Fleet(hosts, op, key, login)


def _refused(reply: dict[str, Any], reason: str) -> None:
    assert reply["ok"] is False, reply
    assert reply["error"]["details"].get("reason") == reason, reply


def _asked(fleet: Fleet, argv: list[str]) -> list[tuple[Background, Statement]]:
    return [host.ask(argv) for host in fleet.hosts]


def _decisions(host: Host, request_id: str) -> list[dict[str, Any]]:
    import json

    return [
        p
        for r in host.stack.journal_rows()
        if r["request_id"] == request_id and r["kind"] == "operator.action"
        for p in [json.loads(r["payload"])]
    ]


def test_one_touch_approves_the_same_request_on_every_host_and_each_journal_says_so(fleet: Fleet) -> None:
    folder = root_dir()
    asked = _asked(fleet, ["mkdir", str(folder / "one-touch")])
    group = groups.of(s.to_bytes() for _, s in asked)
    assert len(group.members) == 3
    signed = fleet.touch(group)
    for host, (job, statement) in zip(fleet.hosts, asked, strict=True):
        reply = host.decide(statement, group.to_dict(), signed)
        assert reply["ok"] is True and reply["data"]["by"]["user"] == fleet.operator.pw_name, reply
        assert job.result()["ok"] is True
        approved = [p for p in _decisions(host, statement.request) if p["action"] == "approve"]
        assert approved[-1]["method"] == "passkey" and approved[-1]["operator"] == fleet.operator.pw_name
        assert approved[-1]["group"] == {
            "key": group.key,
            "hosts": 3,
            "digest": group.digest,
            "member": groups.statement_digest(statement.to_bytes()),
        }
    assert (folder / "one-touch").is_dir()


def test_a_console_that_alters_one_host_s_statement_gets_nothing_there(fleet: Fleet) -> None:
    asked = _asked(fleet, ["mkdir", str(root_dir() / "altered")])
    (job0, s0), (job1, s1), (job2, s2) = asked
    # The console lists host 2 under a statement it altered (the command as shown on the page):
    # the touch signs the altered digest, and host 2's own statement is not in the list.
    altered = dataclasses.replace(s2, command="mkdir /elsewhere")
    bent = groups.Group(
        groups.request_key(s0.to_bytes()),
        tuple(sorted(groups.statement_digest(s.to_bytes()) for s in (s0, s1, altered))),
    )
    signed = fleet.touch(bent)
    reply = fleet.hosts[2].call(
        "passkey.decide",
        {
            "id": s2.request,
            "decision": "allow",
            "statement": s2.render(),
            "group": bent.to_dict(),
            "credential": signed,
        },
    )
    _refused(reply, "group")
    # Sent with the altered statement text itself: not this request's current one.
    changed = fleet.hosts[2].decide(altered, bent.to_dict(), signed)
    assert changed["ok"] is False and changed["error"]["details"].get("reason") == "request_changed", changed
    assert wait_pending(fleet.hosts[2].stack, s2.request)
    # Control: the honest members of that list approve with the same touch.
    for host, job, s in ((fleet.hosts[0], job0, s0), (fleet.hosts[1], job1, s1)):
        assert host.decide(s, bent.to_dict(), signed)["ok"] is True
        assert job.result()["ok"] is True
    _cleanup(fleet.hosts[2], s2, job2)


def test_a_host_dropped_from_the_list_and_a_different_request_slipped_in_get_nothing(fleet: Fleet) -> None:
    folder = root_dir()
    asked = _asked(fleet, ["mkdir", str(folder / "dropped")])
    odd_job, odd = fleet.hosts[2].ask(["mkdir", str(folder / "odd")])  # one byte... and more: another request
    assert groups.request_key(odd.to_bytes()) != groups.request_key(asked[0][1].to_bytes())
    two = groups.of([asked[0][1].to_bytes(), asked[1][1].to_bytes()])
    signed = fleet.touch(two)
    # Host 2's own request of the group was dropped from the list: the touch counts nothing there.
    _refused(fleet.hosts[2].decide(asked[2][1], two.to_dict(), signed), "group")
    # A different request slipped into a list under the group's key: its host refuses it.
    slipped = groups.Group(two.key, tuple(sorted([*two.members, groups.statement_digest(odd.to_bytes())])))
    _refused(fleet.hosts[2].decide(odd, slipped.to_dict(), fleet.touch(slipped)), "group")
    with pytest.raises(Exception, match="not the same request"):
        groups.of([asked[0][1].to_bytes(), odd.to_bytes()])
    assert wait_pending(fleet.hosts[2].stack, odd.request) and wait_pending(fleet.hosts[2].stack, asked[2][1].request)
    assert not (folder / "odd").exists()
    # Control: the two hosts it lists approve.
    for host, (job, s) in zip(fleet.hosts[:2], asked[:2], strict=True):
        assert host.decide(s, two.to_dict(), signed)["ok"] is True and job.result()["ok"] is True
    _cleanup(fleet.hosts[2], asked[2][1], asked[2][0])
    _cleanup(fleet.hosts[2], odd, odd_job)


def test_a_replayed_group_assertion_the_other_verdict_and_a_sign_in_get_nothing(fleet: Fleet) -> None:
    folder = root_dir()
    first = _asked(fleet, ["mkdir", str(folder / "replay")])
    group = groups.of(s.to_bytes() for _, s in first)
    signed = fleet.touch(group)
    host = fleet.hosts[0]
    # Presented as a sign-in: the sign-in's challenge is approval's own, not the group's.
    login = host.call("passkey.login_begin", {"client": BROWSER})["data"]
    _refused(
        host.call(
            "passkey.login_finish", {"challenge_id": login["challenge_id"], "credential": signed, "client": BROWSER}
        ),
        "challenge",
    )
    # A sign-in assertion presented as the group's decision.
    sign_in = fleet.key.sign(login["options"]["challenge"])
    _refused(host.decide(first[0][1], group.to_dict(), sign_in), "challenge")
    # The touch for allow carried as a deny: the deny statement is not in the signed list.
    deny = host.statement(first[0][1].request, "deny")
    _refused(host.decide(deny, group.to_dict(), signed), "group")
    # The same group without a group (as a single decision): another challenge.
    single = host.call(
        "passkey.decide",
        {"id": first[0][1].request, "decision": "allow", "statement": first[0][1].render(), "credential": signed},
    )
    _refused(single, "challenge")
    assert wait_pending(host.stack, first[0][1].request) and not (folder / "replay").exists()
    # Control: it approves once on each host ...
    for h, (job, s) in zip(fleet.hosts, first, strict=True):
        assert h.decide(s, group.to_dict(), signed)["ok"] is True and job.result()["ok"] is True
    # ... and a second identical request, listed with the first, never takes the same touch.
    job, again = host.ask(["mkdir", str(folder / "replay")])
    wider = groups.Group(group.key, tuple(sorted([*group.members, groups.statement_digest(again.to_bytes())])))
    assert groups.request_key(again.to_bytes()) == group.key
    _refused(host.decide(again, wider.to_dict(), signed), "challenge")  # the touch signed the narrower list
    assert wait_pending(host.stack, again.request)
    _cleanup(host, again, job)


def _cleanup(host: Host, statement: Statement, job: Background) -> None:
    """Deny a request left pending by a test (as root), so the next test starts clean."""
    reply = host.stack.native("deny", {"id": statement.request, "reason": "test cleanup"}, path=host.stack.operator)
    assert reply["ok"] is True, reply
    assert job.result()["ok"] is False


def test_a_request_that_differs_only_where_no_line_shows_is_never_grouped(fleet: Fleet) -> None:
    """The request key leaves out each host's own ticket binding (it names that host's inode numbers,
    never shared by two machines); the fleet binding stands for it and still carries the spec's digest.
    Asked with another timeout, a request reads the same in every line a person sees, and is another
    request: a console that groups it anyway gets nothing on its host."""
    folder = root_dir()
    argv = ["mkdir", str(folder / "timeout")]
    job0, s0 = fleet.hosts[0].ask(argv)
    job1, s1 = fleet.hosts[1].ask(argv, timeout_ms=7000)
    people = ("decision", "requester", "run_as", "command", "cwd", "stdin", "reason", "arguments")
    assert [getattr(s0, f) for f in people] == [getattr(s1, f) for f in people]
    assert s0.fleet_binding != s1.fleet_binding
    assert groups.request_key(s0.to_bytes()) != groups.request_key(s1.to_bytes())
    bent = groups.Group(
        groups.request_key(s0.to_bytes()),
        tuple(sorted(groups.statement_digest(s.to_bytes()) for s in (s0, s1))),
    )
    _refused(fleet.hosts[1].decide(s1, bent.to_dict(), fleet.touch(bent)), "group")
    assert wait_pending(fleet.hosts[1].stack, s1.request) and not (folder / "timeout").exists()
    # Control: the same request (no timeout) on another host is one group with host 0's; one touch.
    job2, s2 = fleet.hosts[2].ask(argv)
    assert s2.fleet_binding == s0.fleet_binding
    same = groups.of([s0.to_bytes(), s2.to_bytes()])
    signed = fleet.touch(same)
    for host, job, s in ((fleet.hosts[0], job0, s0), (fleet.hosts[2], job2, s2)):
        assert host.decide(s, same.to_dict(), signed)["ok"] is True
        assert job.result()["ok"] is True
    _cleanup(fleet.hosts[1], s1, job1)


def test_only_root_imports_passkeys(fleet: Fleet) -> None:
    """A line names whose votes a passkey makes: an operator who could import could vote as another."""
    host = fleet.hosts[1]
    stranger = SoftAuthenticator(ORIGIN, RP)
    line = {
        "credential_id": stranger.id,
        "public_key": b64u(stranger.cose_key()),
        "account": fleet.operator.pw_name,
        "created": 1_700_000_000,
        "revoked": None,
    }
    _refused(call_as(host.stack.operator, fleet.operator, "passkey.import", {"credentials": [line]}), "not_root")
    by_web = host.call("passkey.import", {"credentials": [line]})
    assert by_web["ok"] is False and by_web["error"]["code"] == "unauthorized", by_web
    listed = host.stack.native("passkey.list", {}, path=host.stack.operator)["data"]["passkeys"]
    assert stranger.id not in {p["credential_id"] for p in listed}
    # Control: root imports it, journaled; then a revoked line revokes it.
    done = host.stack.native("passkey.import", {"credentials": [line], "source": "t"}, path=host.stack.operator)
    assert done["ok"] is True and done["data"]["results"][0]["result"] == "imported", done
    gone = host.stack.native(
        "passkey.import", {"credentials": [line | {"revoked": 1_700_000_001}]}, path=host.stack.operator
    )
    assert gone["data"]["results"][0]["result"].startswith("revoked"), gone
    listed = host.stack.native("passkey.list", {}, path=host.stack.operator)["data"]["passkeys"]
    assert [p["revoked"] is not None for p in listed if p["credential_id"] == stranger.id] == [True]


def test_the_console_s_observer_login_carries_a_touch_and_decides_nothing_itself(fleet: Fleet) -> None:
    """What root on the bastion holds on each host: an observer login. It reads, carries, and that is all."""
    asked = _asked(fleet, ["mkdir", str(root_dir() / "observer")])
    for host, (_job, s) in zip(fleet.hosts, asked, strict=True):
        for verb in ("approve", "hold", "passkey.import"):
            tried = call_as(host.stack.operator, fleet.login, verb, {"id": s.request, "reason": "bastion"})
            assert tried["ok"] is False and tried["error"]["code"] == "unauthorized", (verb, tried)
        read = call_as(host.stack.operator, fleet.login, "statement", {"id": s.request})
        assert read["ok"] is True and read["data"]["statement"] == s.render()
        assert wait_pending(host.stack, s.request)
    # Control: the same login carries the person's one touch, and each host counts it.
    group = groups.of(s.to_bytes() for _, s in asked)
    signed = fleet.touch(group)
    for host, (job, s) in zip(fleet.hosts, asked, strict=True):
        args = {"id": s.request, "decision": "allow", "statement": s.render(), "group": group.to_dict()}
        carried = call_as(host.stack.operator, fleet.login, "passkey.decide", args | {"credential": signed})
        assert carried["ok"] is True and carried["data"]["by"]["user"] == fleet.operator.pw_name, carried
        assert job.result()["ok"] is True
