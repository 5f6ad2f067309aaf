"""A rule's ``sandbox:`` (issue 22): validated when loaded, carried by the deciding rule's stages."""

from __future__ import annotations

import os

import pytest

from airlock.approval.policy import assemble
from airlock.approval.policyfile import PolicyError, parse_policy_text
from airlock.approval.rules import Policy
from airlock.common import sandbox

D = "/etc/airlock/policy.d/20-mount.yaml"
TRUE = os.path.realpath("/usr/bin/true")
ID = os.path.realpath("/usr/bin/id")


def load(rules: str) -> Policy:
    return assemble([parse_policy_text(rules, D, main=False)])


def errors(rules: str) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(rules, D, main=False)
    return str(info.value)


def test_a_stage_carries_its_deciding_rules_sandbox() -> None:
    from airlock.approval.rules import Subject

    p = load(
        "rules:\n"
        "  - name: confined\n    decision: allow\n    commands: [[/usr/bin/true]]\n"
        "    sandbox: {read_only: true, private_network: true, memory_max: 256M}\n"
        "  - name: plain\n    decision: allow\n    commands: [[/usr/bin/id]]\n"
    )
    who = Subject(1000, "u", frozenset({"u"}), None, False, 1000)
    decision = p.decide(who, [["true"], ["id"]])
    assert decision.stages[0].sandbox == {"read_only": True, "private_network": True, "memory_max": "256M"}
    assert decision.stages[1].sandbox is None
    # As `airlock policy check` shows them.
    assert sandbox.describe(decision.stages[0].sandbox) == "memory_max=256M; private_network=True; read_only=True"
    assert sandbox.describe(decision.stages[1].sandbox) == "none (a full job, as with sudo)"
    assert decision.to_dict()["stages"][0]["sandbox"]["read_only"] is True


@pytest.mark.parametrize(
    ("sandbox", "message"),
    [
        ("{readonly: true}", "rules[0] (r).sandbox.readonly: unknown key"),
        ("{read_only: maybe}", "rules[0] (r).sandbox.read_only: expected true or false"),
        ("{read_write_paths: [var/lib]}", "rules[0] (r).sandbox.read_write_paths: expected an absolute path"),
        ("{capabilities: [CAP_ALL]}", "rules[0] (r).sandbox.capabilities: expected a list of capability names"),
        ("[read_only]", "rules[0] (r).sandbox: expected a mapping of sandbox settings"),
    ],
)
def test_a_bad_sandbox_names_file_line_and_key(sandbox: str, message: str) -> None:
    text = f"rules:\n  - name: r\n    decision: allow\n    commands: [[/usr/bin/true]]\n    sandbox: {sandbox}\n"
    got = errors(text)
    assert got.startswith(f"{D}:5:") and message in got, got
