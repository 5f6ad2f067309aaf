"""A fleet console's kill, hold and release (issue 49): a person's touch over the host's own statement, or nothing.

Three `airlock dev up` stacks stand for three hosts (test_sec_fleet_groups'
fleet: one console origin, one operator with one passkey listed on each, the
console's SSH login an observer).  The console is played by that observer
calling ``passkey.act_begin`` / ``passkey.act`` on each host's
operator.sock, as `airlock passkey carry` does.  A compromised console that
replays a person's kill assertion on another host, or for another job on
the same host, or twice, kills nothing; nor does its own ``kill`` or
``hold``.  Control: the same assertion, carried to the host and job it was
made for, kills that job, journaled as the person's.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import test_sec_fleet_groups
from secsupport import needs_root
from test_sec_fleet_groups import Fleet, Host
from test_sec_passkeys import call_as

from airlock.common import actions

from softauthn import b64u
from support import Background

pytestmark = [needs_root]
fleet = test_sec_fleet_groups.fleet  # its module fixture: three live hosts, an observer login, one passkey


def _observer(fleet: Fleet, host: Host, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    """The console's SSH login (an observer there) calling ``verb`` on ``host``'s operator.sock."""
    return call_as(host.stack.operator, fleet.login, verb, args)


def _running(fleet: Fleet, host: Host, argv: list[str]) -> Background:
    """A job the operator approved on ``host`` with a touch (its own statement), running now."""
    job, statement = host.ask(argv)
    begun = host.call("passkey.decide_begin", {"id": job.request_id, "decision": "allow"})
    touch = fleet.key.sign(begun["data"]["challenge"])
    said = {"id": job.request_id, "decision": "allow", "statement": statement.render(), "credential": touch}
    assert host.call("passkey.decide", said)["ok"] is True
    deadline = time.monotonic() + 30
    while not _is_running(host, job):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    return job


def _is_running(host: Host, job: Background) -> bool:
    listed = host.stack.native("running", {}, path=host.stack.operator)["data"]["running"]
    return any(j.get("request_id") == job.request_id for j in listed)


def _begin_kill(fleet: Fleet, host: Host, job: Background) -> dict[str, Any]:
    begun = _observer(fleet, host, "passkey.act_begin", {"action": "kill", "ref": job.request_id})
    assert begun["ok"] is True, begun
    data: dict[str, Any] = begun["data"]
    return data


def _act(fleet: Fleet, host: Host, challenge_id: str, members: list[str], credential: Any) -> dict[str, Any]:
    args = {"challenge_id": challenge_id, "members": members, "credential": credential}
    return _observer(fleet, host, "passkey.act", args)


def _refused(reply: dict[str, Any], *reasons: str) -> None:
    assert reply["ok"] is False, reply
    assert reply["error"]["details"].get("reason") in reasons, reply


def _kills(host: Host, job: Background) -> list[dict[str, Any]]:
    return [
        p
        for r in host.stack.journal_rows()
        if r["request_id"] == job.request_id and r["kind"] == "operator.action"
        for p in [json.loads(r["payload"])]
        if p.get("action") == "kill"
    ]


def test_a_kill_assertion_replayed_on_another_host_or_job_kills_nothing(fleet: Fleet) -> None:
    marker = f"{600 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"
    one, two = fleet.hosts[0], fleet.hosts[1]
    target = _running(fleet, one, ["sleep", marker])
    same_host_other_job = _running(fleet, one, ["sleep", marker + "1"])
    other_host_job = _running(fleet, two, ["sleep", marker])  # the same command, on another host
    jobs = [(one, target), (one, same_host_other_job), (two, other_host_job)]
    # The console's own login is an observer: it cannot kill or hold by itself.
    assert _observer(fleet, one, "kill", {"ref": target.request_id})["error"]["code"] == "unauthorized"
    assert _observer(fleet, one, "hold", {"reason": "x"})["error"]["code"] == "unauthorized"

    made = _begin_kill(fleet, one, target)
    said = actions.parse(made["statement"])
    assert (said["action"], said["request"], said["signal"]) == ("kill", target.request_id, "TERM"), said
    touch = fleet.key.sign(b64u(actions.challenge([made["digest"]])))  # the person's touch: kill target on one

    # Replayed on another host, for the same command there: that host's statement is not the one signed.
    there = _begin_kill(fleet, two, other_host_job)
    _refused(_act(fleet, two, there["challenge_id"], [made["digest"]], touch), "group")
    there = _begin_kill(fleet, two, other_host_job)
    _refused(_act(fleet, two, there["challenge_id"], [], touch), "challenge")
    there = _begin_kill(fleet, two, other_host_job)  # both digests listed: the touch signed one only
    both = sorted([made["digest"], there["digest"]])
    _refused(_act(fleet, two, there["challenge_id"], both, touch), "challenge")
    # Replayed on the same host for another job.
    other = _begin_kill(fleet, one, same_host_other_job)
    _refused(_act(fleet, one, other["challenge_id"], [made["digest"]], touch), "group")
    other = _begin_kill(fleet, one, same_host_other_job)
    _refused(_act(fleet, one, other["challenge_id"], [], touch), "challenge")
    # A guessed or made-up challenge ID.
    _refused(_act(fleet, one, "no-such-challenge", [made["digest"]], touch), "challenge")
    assert all(_is_running(host, job) for host, job in jobs)
    assert not any(_kills(host, job) for host, job in jobs)

    # Control: carried to the host and job it was made for, the same touch kills that job, as the person.
    done = _act(fleet, one, made["challenge_id"], [made["digest"]], touch)
    assert done["ok"] is True and done["data"]["by"]["user"] == fleet.operator.pw_name, done
    assert target.result(30)["data"]["stages"][0]["signal"] == 15
    killed = _kills(one, target)
    assert [(k["operator"], k["method"], k["carrier"]["user"]) for k in killed] == [
        (fleet.operator.pw_name, "passkey", fleet.login.pw_name)
    ]
    # Replayed once more, even with the same challenge ID: spent.
    _refused(_act(fleet, one, made["challenge_id"], [made["digest"]], touch), "challenge")
    other = _begin_kill(fleet, one, same_host_other_job)
    _refused(_act(fleet, one, other["challenge_id"], [made["digest"]], touch), "group")
    assert _is_running(one, same_host_other_job) and _is_running(two, other_host_job)
    for host, job in jobs[1:]:
        host.stack.native("kill", {"ref": job.request_id, "reason": "test cleanup"}, path=host.stack.operator)
        job.result(30)


def test_a_hold_touch_for_one_host_does_not_hold_another(fleet: Fleet) -> None:
    one, two = fleet.hosts[0], fleet.hosts[1]
    mine = _observer(fleet, one, "passkey.act_begin", {"action": "hold", "reason": "incident"})["data"]
    touch = fleet.key.sign(b64u(actions.challenge([mine["digest"]])))
    theirs = _observer(fleet, two, "passkey.act_begin", {"action": "hold", "reason": "incident"})["data"]
    _refused(_act(fleet, two, theirs["challenge_id"], [mine["digest"]], touch), "group")
    assert two.stack.native("status", {}, path=two.stack.operator)["data"]["hold"] is False
    # A hold needs a person: a carry without an assertion is refused, and holds nothing.
    theirs = _observer(fleet, two, "passkey.act_begin", {"action": "hold", "reason": "incident"})["data"]
    assert _act(fleet, two, theirs["challenge_id"], [], None)["ok"] is False
    assert two.stack.native("status", {}, path=two.stack.operator)["data"]["hold"] is False
    # Control: on its own host the touch holds; released after.
    assert _act(fleet, one, mine["challenge_id"], [mine["digest"]], touch)["ok"] is True
    assert one.stack.native("status", {}, path=one.stack.operator)["data"]["hold"] is True
    one.stack.native("release", {}, path=one.stack.operator)


def test_a_kill_touch_for_a_job_that_ended_journals_no_kill(fleet: Fleet) -> None:
    """The statement binds one operation: if it ended before the touch came back, nothing is journaled as killed."""
    host = fleet.hosts[2]
    job = _running(fleet, host, ["sleep", f"{600 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"])
    made = _begin_kill(fleet, host, job)
    host.stack.native("kill", {"ref": job.request_id, "reason": "ended first"}, path=host.stack.operator)
    job.result(30)
    touch = fleet.key.sign(b64u(actions.challenge([made["digest"]])))
    reply = _act(fleet, host, made["challenge_id"], [made["digest"]], touch)
    assert reply["ok"] is False and reply["error"]["code"] == "not_found", reply
    assert [k["operator"] for k in _kills(host, job)] == ["root"]  # root's own kill only, not the person's
