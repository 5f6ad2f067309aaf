"""Property: rule order and file layout never change a decision."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.approval.policy import assemble
from airlock.approval.policyfile import PolicyFile, parse_policy_text
from airlock.approval.rules import _RANK, DEFAULT_RULE, Policy, Subject

BINARIES = ["/usr/bin/a", "/usr/bin/b", "/usr/bin/c"]
ARGS = ["x", "y", "-o", "a b", "", "..", "z;w"]


def resolver(name: str, search_path: str) -> str | None:
    return name if name in BINARIES else None


element = st.sampled_from([*ARGS, "{p}", "{q}"])


@st.composite
def patterns(draw: st.DrawFn) -> list[str]:
    body = draw(st.lists(element, max_size=3))
    tail = ["..."] if draw(st.booleans()) else []
    return [draw(st.sampled_from(BINARIES)), *body, *tail]


@st.composite
def rule_bodies(draw: st.DrawFn) -> dict[str, Any]:
    rule: dict[str, Any] = {"decision": draw(st.sampled_from(["allow", "ask", "deny"]))}
    optional = {
        "users": st.lists(st.sampled_from(["alice", "bob", "1000"]), min_size=1, max_size=2),
        "groups": st.lists(st.sampled_from(["g1", "g2"]), min_size=1, max_size=2),
        "sessions": st.lists(st.sampled_from(["s1", "s2"]), min_size=1, max_size=2),
        "privileged": st.booleans(),
        "commands": st.lists(patterns(), min_size=1, max_size=3),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            rule[key] = draw(strategy)
    return rule


subjects = st.builds(
    lambda uid, user, groups, session, privileged: Subject(
        uid, user, frozenset(groups), session, privileged, 0 if privileged else uid
    ),
    st.sampled_from([0, 1000, 1001]),
    st.sampled_from(["alice", "bob", "carol"]),
    st.sets(st.sampled_from(["g1", "g2", "g3"])),
    st.sampled_from([None, "s1", "s2"]),
    st.booleans(),
)
stages = st.lists(
    st.lists(st.sampled_from(ARGS), max_size=4).flatmap(
        lambda args: st.sampled_from([*BINARIES, "missing"]).map(lambda head: [head, *args])
    ),
    min_size=1,
    max_size=3,
)


def main_file(default: str, rules: list[dict[str, Any]]) -> PolicyFile:
    text = yaml.safe_dump({"policy": {"default": default, "rules": rules}})
    return parse_policy_text(text, "/etc/airlock/airlock.yaml", main=True)


def dropin(index: int, rules: list[dict[str, Any]]) -> PolicyFile:
    return parse_policy_text(yaml.safe_dump({"rules": rules}), f"/etc/airlock/policy.d/{index:02}.yaml", main=False)


@settings(max_examples=300, deadline=None)
@given(
    default=st.sampled_from(["allow", "ask", "deny"]),
    bodies=st.lists(rule_bodies(), max_size=8),
    data=st.data(),
    who=subjects,
    pipeline=stages,
)
def test_shuffling_and_splitting_rules_never_changes_a_decision(
    default: str, bodies: list[dict[str, Any]], data: st.DataObject, who: Subject, pipeline: list[list[str]]
) -> None:
    rules = [{"name": f"rule-{i}", **body} for i, body in enumerate(bodies)]
    reference = assemble([main_file(default, rules)])
    expected = reference.decide(who, pipeline, resolver=resolver)

    shuffled = data.draw(st.permutations(rules))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(shuffled)), max_size=4)))
    chunks = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)]
    files = [main_file(default, chunks[0])] + [dropin(i, chunk) for i, chunk in enumerate(chunks[1:], start=1)]
    files = data.draw(st.permutations(files))
    other: Policy = assemble(files)

    assert sorted(r.name for r in other.rules) == sorted(r.name for r in reference.rules)
    assert other.decide(who, pipeline, resolver=resolver) == expected
    _check_against_a_simple_model(reference, who, pipeline, expected.decision)


def _check_against_a_simple_model(policy: Policy, who: Subject, pipeline: list[list[str]], decision: str) -> None:
    # The pipeline's decision is the most restrictive stage decision, each of
    # which is the most restrictive matching rule, else the default; a stage
    # whose binary does not resolve is denied (it cannot run: issue 44).
    worst = 0
    for stage in pipeline:
        resolved = resolver(stage[0], "")
        ranks = [
            _RANK[r.decision] for r in policy.rules if r.applies_to(who) and r.matches_command(resolved, stage[1:])
        ]
        fallback = _RANK[policy.default]
        worst = max(worst, _RANK["deny"] if resolved is None else max(ranks) if ranks else fallback)
    assert _RANK[decision] == worst


def test_the_model_sees_the_default() -> None:
    policy = assemble([main_file("ask", [])])
    decision = policy.decide(Subject(1, "a", frozenset(), None, False, 1), [["/usr/bin/a"]], resolver=resolver)
    assert (decision.decision, decision.rule) == ("ask", DEFAULT_RULE)
