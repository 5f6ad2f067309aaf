"""The audit never loses a job's end (issue 29, attack 1), against a live stack.

An agent pads argv so that ``request.received``, ``approval.decided`` and
``exec.started`` stay under the journal's 64 KiB payload cap while the end
record, which used to repeat argv next to the evidence, goes over it: the job
ran, the runner only logged ``runner.audit.unrecorded``, intake answered ok, and
``airlock audit verify --lifecycle`` saw nothing wrong.

Now the end record names argv by digest, and the runner checks before
``exec.started`` that the largest end record the job can produce fits; and an
ok reply with no end record is a lifecycle violation.  Control: 60,000 bytes of
argv, whose end record fitted even before.
"""

from __future__ import annotations

import hashlib
import json
import pwd
from collections.abc import Iterator
from typing import Any

import pytest
from secsupport import agent_request, final, needs_root, red_stack, throwaway_user

from airlock.common.codec import canonical_json

from support import Stack

pytestmark = needs_root


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alend") as user:
        yield user


@pytest.fixture(scope="module")
def estack(agent: pwd.struct_passwd) -> Iterator[Stack]:
    config = f"""
agents:
  users: [{agent.pw_name}]
policy:
  default: deny
  rules:
    - name: padded
      decision: allow
      users: [{agent.pw_name}]
      privileged: false
      commands: [[/usr/bin/true, "..."]]  # no output: the reply comes back through a pipe
"""
    with red_stack(config) as stack:
        yield stack


def _story(stack: Stack, request_id: str) -> dict[str, Any]:
    return {r["kind"]: json.loads(r["payload"]) for r in stack.journal_rows() if r["request_id"] == request_id}


def _lifecycle(stack: Stack) -> dict[str, Any]:
    r = stack.cli("audit", "verify", "--lifecycle", "--json")
    data: dict[str, Any] = json.loads(r.stdout)["data"]["lifecycle"]
    return data


@pytest.mark.parametrize("size", [60_000, 64_800])
def test_a_padded_argv_never_loses_the_end_record(estack: Stack, agent: pwd.struct_passwd, size: int) -> None:
    argv = ["/usr/bin/true", "x" * size]
    request_id = f"pad-{size}"
    proc = agent_request(estack.agent, agent, "exec", {"argv": argv, "privileged": False}, request_id=request_id)
    assert proc.stdout is not None
    out = proc.stdout.read()  # read before waiting: the reply repeats argv, more than a pipe holds
    assert proc.wait(90) == 0
    reply = final(json.loads(out))
    assert reply["ok"] is True, reply  # it ran
    story = _story(estack, request_id)
    # request.received holds argv whole (show reads it there); the end record is in the journal
    assert story["request.received"]["request"]["stages"] == [argv]
    assert "exec.finished" in story, sorted(story)  # 64,800: missing before the fix
    (stage,) = story["exec.finished"]["stages"]
    assert stage["argv_sha256"] == hashlib.sha256(canonical_json(argv)).hexdigest()
    assert "argv" not in stage
    # exec.started names the whole spec by digest (issue 50): request.received holds it, once
    assert "spec" not in story["exec.started"]
    assert story["exec.started"]["digest"] == story["request.received"]["digest"]
    checked = _lifecycle(estack)
    assert checked["ok"] is True, checked
    shown = estack.cli("show", request_id, "--json")
    assert shown.returncode == 0 and "x" * size in shown.stdout  # argv still readable, from the first record
