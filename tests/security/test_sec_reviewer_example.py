"""The shipped example reviewer is not fooled by journalctl's option abbreviations (issue 45 item 4).

A live `airlock dev up` stack (as root) with docs/examples/reviewer-example.py as its reviewer
(installed root-owned, as docs/policy.md says) and docs/policy.md's ``ops-reads`` rule
(``reviewer: allow`` on ``[/usr/bin/journalctl, "..."]``).  journalctl (getopt_long) takes any
unambiguous abbreviation and combined short options: ``--cursor-fi=FILE --director=DIR`` is
``--cursor-file=FILE --directory=DIR`` (root writes FILE), ``-rD DIR`` reads another directory.
The example used to match option names by prefix and let these through as "read-only"; now
each waits for a person (and nothing runs).  Control: a read-only journalctl, abbreviated, is the
reviewer's to allow and runs at once.
"""

from __future__ import annotations

import os
import shutil
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

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "reviewer-example.py"


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Any, Any]]:
    with throwaway_user("alrxa") as alice, throwaway_user("alrxr") as reviewer:
        yield alice, reviewer


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="alrx-root", dir="/tmp"))
    os.chmod(folder, 0o755)
    (folder / "empty").mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def xstack(users: tuple[Any, Any], place: Path) -> Iterator[Stack]:
    alice, reviewer = users
    script = place / "reviewer"
    shutil.copy(EXAMPLE, script)
    os.chmod(script, 0o755)
    config = f"""
agents:
  users: [{alice.pw_name}]
approval:
  timeout_seconds: 40
  reviewer_command: [{script}]
  reviewer_user: {reviewer.pw_name}
  reviewer_timeout_seconds: 10
  reviewer_name: example
policy:
  default: deny
  rules:
    - name: ops-reads
      decision: ask
      reviewer: allow
      privileged: true
      commands:
        - [/usr/bin/systemctl, status, "..."]
        - [/usr/bin/journalctl, "..."]
"""
    with red_stack(config) as stack:
        yield stack


def ask(stack: Stack, user: Any, argv: list[str]) -> tuple[Any, str]:
    request_id = f"rx-{uuid.uuid4()}"
    args = {"argv": argv, "privileged": True, "operation_id": f"op-{uuid.uuid4()}"}
    return agent_request(stack.agent, user, "exec", args, request_id=request_id), request_id


def waits_for_a_person(stack: Stack, user: Any, argv: list[str]) -> None:
    proc, request_id = ask(stack, user, argv)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{argv} was decided without a person: {final(replies(proc))}")
        listed = stack.native("pending", path=stack.operator)["data"]["pending"]
        entry = next((p for p in listed if p["request_id"] == request_id), None)
        if entry is not None:
            assert entry["reviewer"]["decision"] == "ask", entry["reviewer"]
            assert stack.native("deny", {"id": request_id}, path=stack.operator)["ok"] is True
            assert final(replies(proc))["error"]["code"] == "denied"
            return
        time.sleep(0.05)
    raise AssertionError("neither ran nor waited")


@pytest.mark.parametrize(
    "form",
    [
        ["--cursor-fi={place}/cursor", "--director={place}/empty", "-n", "1"],
        ["-rD", "{place}/empty"],
        ["--director", "{place}/empty", "--no-pa"],
        ["-n", "1", "--cursor-f", "{place}/cursor", "-D{place}/empty"],
    ],
)
def test_abbreviated_writing_options_wait_for_a_person(xstack: Stack, users: Any, place: Path, form: list[str]) -> None:
    alice, _ = users
    waits_for_a_person(xstack, alice, ["journalctl", *(part.format(place=place) for part in form)])
    assert not (place / "cursor").exists()


def test_control_a_read_only_journalctl_is_the_reviewers_to_allow(xstack: Stack, users: Any) -> None:
    alice, _ = users
    proc, _ = ask(xstack, alice, ["journalctl", "-u", "airlock-test-nothing", "--no-pa", "-rn1"])
    reply = final(replies(proc))
    assert reply["ok"] is True, reply
    assert reply["data"]["decision"]["decided_by"] == "reviewer example"
