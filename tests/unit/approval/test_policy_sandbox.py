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


# --- issue 27 item 6: several deciding rules' sandboxes merge, most restrictive per key ------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from airlock.approval.rules import Subject  # noqa: E402

WHO = Subject(1000, "u", frozenset({"u"}), None, True, 0)


def test_an_unconfined_rule_named_first_no_longer_drops_anothers_sandbox() -> None:
    # Attack 6: `log-readers` sorts before `web-logs`; it used to decide alone, unconfined.
    p = load(
        "rules:\n"
        "  - name: web-logs\n    decision: allow\n    commands: [[/usr/bin/true, ...]]\n"
        "    sandbox: {read_only: true, private_network: true}\n"
        "  - name: log-readers\n    decision: allow\n    commands: [[/usr/bin/true, ...]]\n"
    )
    stage = p.decide(WHO, [["true", "/var/log/nginx/access.log"]]).stages[0]
    assert stage.rule == "log-readers"  # the label; it decides nothing
    assert stage.deciding == ("log-readers", "web-logs")
    assert stage.sandbox == {"private_network": True, "read_only": True}


def test_only_rules_with_the_winning_decision_are_merged() -> None:
    p = load(
        "rules:\n"
        "  - name: a\n    decision: allow\n    commands: [[/usr/bin/true]]\n    sandbox: {private_tmp: true}\n"
        "  - name: b\n    decision: ask\n    commands: [[/usr/bin/true]]\n    sandbox: {tasks_max: 5}\n"
    )
    stage = p.decide(WHO, [["true"]]).stages[0]
    assert (stage.decision, stage.deciding, stage.sandbox) == ("ask", ("b",), {"tasks_max": 5})


def test_most_restrictive_per_key() -> None:
    merged = sandbox.merge(
        [
            {
                "read_only": True,
                "read_write_paths": ["/var/lib/app", "/srv"],
                "capabilities": ["CAP_CHOWN", "CAP_NET_ADMIN"],
                "memory_max": "1G",
                "cpu_quota": "50%",
                "tasks_max": 10,
                "private_tmp": False,
            },
            None,  # a rule without sandbox: adds nothing
            {
                "read_only": True,
                "read_write_paths": ["/var/lib", "/srv/www/"],
                "capabilities": ["CAP_NET_ADMIN", "CAP_SYS_TIME"],
                "memory_max": "512M",
                "cpu_quota": "200%",
                "tasks_max": 64,
                "private_network": True,
            },
            {"no_new_privileges": True, "read_write_paths": ["/tmp"]},  # not read-only: leaves all writable
        ]
    )
    assert merged == {
        "capabilities": ["CAP_NET_ADMIN"],
        "cpu_quota": "50%",
        "memory_max": "512M",
        "no_new_privileges": True,
        "private_network": True,
        "private_tmp": False,
        "read_only": True,
        "read_write_paths": ["/srv/www", "/var/lib/app"],
        "tasks_max": 10,
    }
    assert sandbox.merge([None, None]) is None
    # Read-only rules that leave nothing writable in common: nothing stays writable.
    assert sandbox.merge([{"read_only": True, "read_write_paths": ["/a"]}, {"read_only": True}]) == {"read_only": True}
    # Capabilities that share nothing: none at all (an empty bounding set), never "all".
    assert sandbox.merge([{"capabilities": ["CAP_CHOWN"]}, {"capabilities": ["CAP_KILL"]}]) == {"capabilities": []}
    # A percentage against a size: compared in bytes of this machine's memory.
    assert sandbox.merge([{"memory_max": "50%"}, {"memory_max": "1G"}], physical_memory=4 * 2**30) == {
        "memory_max": "1G"
    }
    assert sandbox.merge([{"memory_max": "10%"}, {"memory_max": "1G"}], physical_memory=4 * 2**30) == {
        "memory_max": "10%"
    }
    assert sandbox.merge([{"memory_max": "infinity"}, {"memory_max": "10%"}]) == {"memory_max": "10%"}
    sandbox.properties(merged)  # the merge is itself a valid sandbox


paths = st.lists(st.sampled_from(["/", "/srv", "/srv/www", "/var", "/var/lib", "/var/lib/app", "/tmp"]), min_size=1)
boxes = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "read_only": st.booleans(),
            "private_network": st.booleans(),
            "private_tmp": st.booleans(),
            "no_new_privileges": st.booleans(),
            "read_write_paths": paths,
            "capabilities": st.lists(st.sampled_from(["CAP_CHOWN", "CAP_KILL", "CAP_NET_ADMIN"]), unique=True),
            "memory_max": st.sampled_from(["256M", "1G", "0.5G", "512M", "infinity", "10%", "90%"]),
            "cpu_quota": st.sampled_from(["10%", "50%", "200%"]),
            "tasks_max": st.integers(1, 100),
        },
    ),
)


def _writable(box: dict[str, object] | None, path: str) -> bool:
    if not box or not box.get("read_only"):
        return True
    return any(path == p or p == "/" or path.startswith(str(p) + "/") for p in box.get("read_write_paths") or [])  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.lists(boxes, max_size=5), st.data())
def test_the_merge_ignores_order_and_confines_at_least_as_much_as_each(
    given_boxes: list[dict[str, object] | None], data: st.DataObject
) -> None:
    merged = sandbox.merge(given_boxes, physical_memory=8 * 2**30)
    assert sandbox.merge(data.draw(st.permutations(given_boxes)), physical_memory=8 * 2**30) == merged
    if merged is not None:
        sandbox.properties(merged)
    for box in given_boxes:
        if not box:
            continue
        assert merged is not None
        for flag in ("read_only", "private_network", "private_tmp", "no_new_privileges"):
            assert merged.get(flag, False) >= box.get(flag, False)  # type: ignore[operator]
        if "capabilities" in box:
            assert set(merged["capabilities"]) <= set(box["capabilities"])  # type: ignore[call-overload]
        if "tasks_max" in box:
            assert merged["tasks_max"] <= box["tasks_max"]  # type: ignore[operator]
        for path in ("/", "/srv", "/srv/www/x", "/var/lib", "/var/lib/app/y", "/tmp", "/etc"):
            # Nothing is writable under the merge that one of the rules keeps read-only.
            assert not _writable(merged, path) or _writable(box, path) or not merged.get("read_only")


names = ["alpha", "beta", "gamma", "delta", "epsilon"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["allow", "ask"]), boxes), min_size=1, max_size=5), st.data())
def test_rule_order_and_names_never_change_a_stages_sandbox(
    rules: list[tuple[str, dict[str, object] | None]], data: st.DataObject
) -> None:
    import yaml

    def policy(order: list[int], naming: list[str]) -> Policy:
        body = []
        for index in order:
            decision, box = rules[index]
            rule: dict[str, object] = {"name": naming[index], "decision": decision, "commands": [["/usr/bin/true"]]}
            if box is not None:
                rule["sandbox"] = box
            body.append(rule)
        return load(yaml.safe_dump({"rules": body}))

    indexes = list(range(len(rules)))
    first = policy(indexes, names).decide(WHO, [["true"]]).stages[0]
    order = data.draw(st.permutations(indexes))
    renamed = data.draw(st.permutations(names))
    other = policy(order, renamed).decide(WHO, [["true"]]).stages[0]
    assert other.decision == first.decision
    assert other.sandbox == first.sandbox


def test_every_deciding_rules_quorum_counts_not_the_first_names() -> None:
    text = (
        "rules:\n"
        "  - name: zz-two-person\n    decision: ask\n    approvals: 2\n    reason: required\n"
        "    commands: [[/usr/bin/true]]\n"
        "  - name: aa-anyone\n    decision: ask\n    commands: [[/usr/bin/true]]\n"
    )
    p = load(text)
    decision = p.decide(WHO, [["true"]])
    assert decision.rule == "aa-anyone"
    requirement = p.requirement(decision)
    assert (requirement.approvals, requirement.reason) == (2, True)
