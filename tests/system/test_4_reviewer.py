"""The reviewer under real systemd (issue 34): the runner starts it as a transient service of its own,
as the package's `airlock-reviewer` user, through a job unit's exec helper that runs the program the
runner checked (runner/review.py).  Until now only the process-group path ran it for real.

The reviewer here says allow with what it saw of itself: its uid and its cgroup.
"""

from __future__ import annotations

import json
import uuid

REVIEWER = """#!/bin/sh
cat > /dev/null
cgroup="$(grep -m1 airlock-reviewer /proc/self/cgroup | cut -d: -f3)"
printf '{"decision": "allow", "reason": "uid %s in %s"}\\n' "$(id -u)" "$cgroup"
"""
POLICY = """rules:
  - name: systest-reviewed
    decision: ask
    reviewer: allow
    privileged: false
    commands: [[/usr/bin/basename, /systest/reviewed]]
"""


def _decided(system, operation_id: str) -> dict:
    r = system.airlock("events", "--tail", "200", "--json", user=system.OPERATOR, check=True)
    events = [e for line in r.stdout.splitlines() for e in (json.loads(line).get("data") or {}).get("events") or []]
    ids = {e["request_id"] for e in events if e.get("operation_id") == operation_id}
    for e in events:
        if e["kind"] == "approval.decided" and e["request_id"] in ids:
            return e["payload"]
    raise AssertionError(f"no decision for {operation_id}")


def test_a_reviewer_decides_from_a_unit_of_its_own_as_its_own_user(system) -> None:
    system.c.run(["mkdir", "-p", "/usr/local/lib/airlock-systest"])
    system.c.write("/usr/local/lib/airlock-systest/reviewer", REVIEWER, mode=0o755)
    system.c.write("/etc/airlock/policy.d/60-systest-reviewer.yaml", POLICY)
    system.set_config(
        "approval:\n  timeout_seconds: 15\n"
        "  reviewer_command: [/usr/local/lib/airlock-systest/reviewer]\n  reviewer_name: systest\n"
    )
    system.restart_services()
    try:
        operation = f"systest-review-{uuid.uuid4().hex[:12]}"
        r = system.airlock(
            "run", "--no-privilege", "--operation-id", operation, "--", "/usr/bin/basename", "/systest/reviewed"
        )
        assert r.returncode == 0 and r.stdout.strip() == "reviewed", r
        decided = _decided(system, operation)
        uid = system.c.run(["id", "-u", "airlock-reviewer"]).stdout.strip()
        assert decided["by"] == "reviewer systest", decided
        assert decided["reason"].startswith(f"uid {uid} in /"), decided
        assert "/airlock-reviewer-" in decided["reason"] and decided["reason"].endswith(".service"), decided
    finally:
        system.c.run(["rm", "-rf", "/usr/local/lib/airlock-systest", "/etc/airlock/policy.d/60-systest-reviewer.yaml"])
        system.restore_config()
        system.restart_services()
