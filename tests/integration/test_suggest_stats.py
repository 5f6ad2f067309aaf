"""Issue 34 on a live stack: `airlock policy suggest` and `airlock stats` from the journal.

Operators approve the same kind of command again and again; `policy suggest`
proposes a policy.d file (not applied) that, once an operator installs it and
approval reloads, allows exactly those requests without asking, while a
command nobody approved still asks.  `airlock stats` counts a known sequence.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import Background, Stack, custom_stack, wait_pending

CONFIG = """
approval:
  timeout_seconds: 2
policy:
  default: ask
  rules:
    - name: okay
      decision: allow
      commands: [[/usr/bin/true]]
    - name: nope
      decision: deny
      commands: [[/usr/bin/false]]
"""


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with custom_stack(tmp_path / "run", CONFIG) as s:
        yield s


def approved(stack: Stack, argv: list[str], **more: Any) -> dict[str, Any]:
    job = Background(stack, {"argv": argv} | more)
    wait_pending(stack, job.request_id)
    assert stack.cli("approve", "-y", job.request_id).returncode == 0
    reply = job.result()
    assert reply["ok"] is True, reply
    return reply


def asks(stack: Stack, argv: list[str], **more: Any) -> bool:
    job = Background(stack, {"argv": argv} | more)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if job.reply is not None:
            return False
        if any(
            p["request_id"] == job.request_id for p in stack.native("pending", path=stack.operator)["data"]["pending"]
        ):
            assert stack.native("deny", {"id": job.request_id}, path=stack.operator)["ok"]
            job.result()
            return True
        time.sleep(0.05)
    raise AssertionError("neither ran nor waited")


def reload_approval(stack: Stack) -> None:
    before = sum(1 for r in stack.journal_rows() if r["kind"] == "policy.reloaded")
    os.kill(stack.service_pid("approval"), signal.SIGHUP)
    deadline = time.monotonic() + 15
    while sum(1 for r in stack.journal_rows() if r["kind"] == "policy.reloaded") == before:
        assert time.monotonic() < deadline, "approval did not reload"
        time.sleep(0.05)


def test_suggested_rules_load_and_allow_the_requests_operators_approved(stack: Stack, tmp_path: Path) -> None:
    names = [f"f{n}" for n in range(5)]
    for name in names:  # a file name, not a path: a path never becomes a placeholder
        approved(stack, ["touch", name], cwd=str(tmp_path))
    for _ in range(2):
        approved(stack, ["mkdir", "-p", str(tmp_path / "once")])  # below --min
    output = tmp_path / "50-suggested.yaml"
    done = stack.cli("policy", "suggest", "--since", "1h", "--min", "5", "--output", str(output))
    assert done.returncode == 0, done.stderr
    text = output.read_text()
    rules = yaml.safe_load(text)["rules"]
    assert len(rules) == 1, text
    assert rules[0]["commands"] == [["/usr/bin/touch", "{arg1:file}"]]
    assert (rules[0]["cwd"], rules[0]["stdin"]) == (str(tmp_path), "none")  # issue 45: pinned as approved
    assert "# approved 5 times for root" in text and "approved by: root (5)" in text
    # Not applied: the same command still asks until an operator installs the file.
    assert asks(stack, ["touch", "f0"], cwd=str(tmp_path))
    # Install and reload as an operator would: the file loads, and the same requests are allowed by it.
    policy_d = stack.runtime_dir / "policy.d"
    policy_d.mkdir(exist_ok=True)
    (policy_d / output.name).write_text(text)
    reload_approval(stack)
    check = stack.cli("--json", "policy", "check", "--no-privilege", "--cwd", str(tmp_path), "--", "touch", "f3")
    assert check.returncode == 0, check.stderr
    decided = json.loads(check.stdout)["data"]
    assert decided["decision"] == "allow" and decided["rule"] == rules[0]["name"]
    for name in names:
        again = stack.exec({"argv": ["touch", name], "privileged": False, "cwd": str(tmp_path)})
        assert again["ok"] is True and again["data"]["decision"]["rule"] == rules[0]["name"], again
    assert asks(stack, ["mkdir", "-p", str(tmp_path / "once")])  # approved twice only: still asks
    assert asks(stack, ["touch", "-c", "f0"], cwd=str(tmp_path))  # another shape of touch: still asks
    assert asks(stack, ["touch", "f0"], cwd="/tmp")  # another directory: still asks


def test_stats_counts_a_known_sequence(stack: Stack, tmp_path: Path) -> None:
    assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True
    assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True
    assert stack.exec({"argv": ["false"], "privileged": False})["error"]["code"] == "denied"
    approved(stack, ["touch", str(tmp_path / "a")])
    assert asks(stack, ["touch", str(tmp_path / "b")])  # an operator's deny
    timed_out = stack.exec(
        {"argv": ["touch", str(tmp_path / "c")], "privileged": False, "operation_id": str(uuid.uuid4())}
    )
    assert timed_out["error"]["code"] == "approval_timeout"
    done = stack.cli("--json", "stats", "--since", "1h")
    assert done.returncode == 0, done.stderr
    numbers = json.loads(done.stdout)
    assert numbers["requests"] == 6
    assert numbers["decisions"] == {"allow": 3, "deny": 2, "timeout": 1}
    assert numbers["by"] == {"operator": 2, "rule": 3, "timeout": 1}
    assert numbers["asks"]["total"] == 3 and numbers["timeouts"] == 1
    assert numbers["time_to_decision"]["count"] == 2
    assert 0 < numbers["time_to_decision"]["p50_seconds"] <= numbers["time_to_decision"]["p95_seconds"] < 30
    assert numbers["rules"]["okay"]["allow"] == 2 and numbers["rules"]["nope"]["deny"] == 1
    assert numbers["rules"]["default"] | {"by": {}} == {
        "requests": 3,
        "allow": 1,
        "deny": 1,
        "timeout": 1,
        "withdrawn": 0,
        "asked": 3,
        "by": {},
    }
    text = stack.cli("stats", "--since", "1h").stdout
    assert "by who decided: operator 2, rule 3, timeout 1" in text and "timeouts: 1" in text
