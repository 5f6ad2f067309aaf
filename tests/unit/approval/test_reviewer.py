"""Issue 34: the reviewer tier's pure parts -- its answer, where it may decide, the rule keys, shadow rules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airlock.approval import reviewer
from airlock.approval.policy import assemble
from airlock.approval.policyfile import PolicyError, parse_policy_text
from airlock.approval.quorum import Approvers
from airlock.approval.rules import Policy, Rule, Subject
from airlock.cli.policy import shadow_report
from airlock.common import render
from airlock.common.channels.slack import Slack
from airlock.relay import message as msg

ME = Subject(uid=1000, user="agent", groups=frozenset(), session=None, privileged=False, target_uid=1000)


def ran(stdout: str, exit_code: int | None = 0, **extra: Any) -> dict[str, Any]:
    return {"ran": True, "timed_out": False, "exit_code": exit_code, "stdout": stdout, "truncated": False} | extra


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (ran('{"decision": "allow", "reason": "fine"}\n'), ("allow", "fine", "answered")),
        (ran('{"decision": "deny"}'), ("deny", "", "answered")),
        (ran('{"decision": "ask", "reason": "unsure"}\n'), ("ask", "unsure", "answered")),
        (ran('{"decision": "allow"}\n', exit_code=3), ("ask", "", "crashed")),
        (ran('{"decision": "allow"}\n', exit_code=None), ("ask", "", "crashed")),
        (ran("", timed_out=True, exit_code=None), ("ask", "", "timeout")),
        (ran("sure, go ahead\n"), ("ask", "", "garbage")),
        (ran(""), ("ask", "", "garbage")),
        (ran('{"decision": "ALLOW"}'), ("ask", "", "garbage")),
        (ran('{"decision": "allow", "reason": 5}'), ("ask", "", "garbage")),
        (ran('{"decision": "allow", "run": "rm -rf /"}'), ("ask", "", "garbage")),
        (ran('{"decision": "deny"}\n{"decision": "allow"}\n'), ("ask", "", "garbage")),
        (ran('["allow"]'), ("ask", "", "garbage")),
        (ran('{"decision": "allow"}', truncated=True), ("ask", "", "garbage")),
    ],
)
def test_only_one_clean_json_line_is_an_answer(result: dict[str, Any], expected: tuple[str, str, str]) -> None:
    assert reviewer.read_answer(result) == expected


def test_a_long_reason_is_clipped() -> None:
    decision, reason, _ = reviewer.read_answer(ran(json.dumps({"decision": "deny", "reason": "x" * 5000})))
    assert decision == "deny" and len(reason) == reviewer.MAX_REASON


@pytest.mark.parametrize(
    ("answer", "may", "flagged", "denied", "decides"),
    [
        ("allow", "allow", False, False, True),
        ("deny", "allow", False, False, True),
        ("deny", "deny", False, False, True),
        ("allow", "deny", False, False, False),  # a deny-only rule: its allow is an opinion
        ("allow", "advise", False, False, False),
        ("deny", "advise", False, False, False),
        ("allow", "allow", True, False, False),  # flagged arguments: people decide
        ("deny", "allow", True, False, False),
        ("allow", "allow", False, True, False),  # a person denied it before
        ("deny", "allow", False, True, True),
        ("ask", "allow", False, False, False),
    ],
)
def test_where_an_answer_decides(answer: str, may: str, flagged: bool, denied: bool, decides: bool) -> None:
    opinion = reviewer.judge(
        "site", ran(json.dumps({"decision": answer})), may=may, flagged=flagged, denied_before=denied
    )
    assert opinion.decides is decides
    assert opinion.decision == answer
    assert bool(opinion.why_not) is not decides


def test_no_reviewer_reply_is_an_ask() -> None:
    opinion = reviewer.judge("site", None, may="allow", flagged=False, denied_before=False)
    assert (opinion.decision, opinion.outcome, opinion.decides) == ("ask", "unavailable", False)


def rule(name: str, **kw: Any) -> Rule:
    base: dict[str, Any] = {
        "name": name,
        "decision": "ask",
        "users": frozenset(),
        "groups": frozenset(),
        "sessions": frozenset(),
        "privileged": None,
        "commands": (("/usr/bin/true", "..."),),
        "source": "t:1",
    }
    return Rule(**(base | kw))


def decide(policy: Policy, argv: list[str]) -> Any:
    return policy.decide(ME, [argv], resolver=lambda name, path: name)


def test_reviewer_may_is_the_least_any_deciding_rule_gives() -> None:
    allow = rule("a", reviewer="allow")
    assert Policy("deny", (allow,), ()).reviewer_may(decide(Policy("deny", (allow,), ()), ["/usr/bin/true"])) == "allow"
    both = Policy("deny", (allow, rule("b", reviewer="deny")), ())
    assert both.reviewer_may(decide(both, ["/usr/bin/true"])) == "deny"
    unsaid = Policy("deny", (allow, rule("c")), ())
    assert unsaid.reviewer_may(decide(unsaid, ["/usr/bin/true"])) == "advise"
    default = Policy("ask", (), ())
    assert default.reviewer_may(decide(default, ["/usr/bin/true"])) == "advise"
    # A pipeline: the stage a rule allows does not count, the asking stage's rule does.
    piped = Policy("deny", (allow, rule("ok", decision="allow", commands=(("/usr/bin/cat",),))), ())
    decision = piped.decide(ME, [["/usr/bin/cat"], ["/usr/bin/true"]], resolver=lambda n, p: n)
    assert decision.decision == "ask" and piped.reviewer_may(decision) == "allow"


def test_a_quorum_rule_is_advise_only_even_when_built_in_code() -> None:
    for quorum in ({"approvals": 2}, {"approvers": Approvers(users=frozenset({"bob"}))}):
        policy = Policy("deny", (rule("q", reviewer="allow", **quorum),), ())
        assert policy.reviewer_may(decide(policy, ["/usr/bin/true"])) == "advise"


POLICY = "rules:\n  - name: r\n    commands: [[/usr/bin/true]]\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "    decision: allow\n    reviewer: allow\n",
            "rules[0] (r).reviewer: applies only to a rule with decision: ask",
        ),
        ("    decision: ask\n    reviewer: yes\n", "rules[0] (r).reviewer: must be allow, deny or advise"),
        (
            "    decision: ask\n    approvals: 2\n    reviewer: allow\n",
            "rules[0] (r).reviewer: a quorum rule (approvals, approvers) is decided by people only",
        ),
        ("    decision: ask\n    mode: dry-run\n", "rules[0] (r).mode: must be enforce or shadow"),
    ],
)
def test_rule_keys_are_checked_with_their_line(extra: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(POLICY + extra, "/etc/airlock/policy.d/r.yaml", main=False)
    text = str(info.value)
    assert text.startswith("/etc/airlock/policy.d/r.yaml:")
    assert message in text


def test_the_keys_load() -> None:
    text = POLICY + "    decision: ask\n    reviewer: deny\n  - name: s\n    decision: allow\n    mode: shadow\n"
    policy = assemble([parse_policy_text(text, "p.yaml", main=False)])
    assert [r.name for r in policy.rules] == ["r"] and policy.rules[0].reviewer == "deny"
    assert [r.name for r in policy.shadow] == ["s"]
    assert policy.to_dict()["shadow"][0]["mode"] == "shadow"


def test_a_shadow_rule_says_what_the_policy_would_decide_with_it() -> None:
    live = rule("live", decision="allow", commands=(("/usr/bin/true", "..."),))
    strict = rule("strict", decision="deny", commands=(("/usr/bin/true", "--all"),), mode="shadow")
    loose = rule("loose", decision="allow", commands=(("/usr/bin/false",),), mode="shadow")
    policy = Policy("ask", (live,), (), (), (strict, loose))

    def shadows(argv: list[str]) -> list[dict[str, str]]:
        return policy.shadow_verdicts(ME, [argv], resolver=lambda name, path: name)

    assert shadows(["/usr/bin/true", "--all"]) == [{"rule": "strict", "would": "deny", "by": "strict"}]
    assert shadows(["/usr/bin/true", "x"]) == []  # it matches nothing here
    assert shadows(["/usr/bin/false"]) == [{"rule": "loose", "would": "allow", "by": "loose"}]
    # It never decides.
    assert decide(policy, ["/usr/bin/true", "--all"]).decision == "allow"


def decided(decision: str, by: str, shadow: list[dict[str, str]], policy: str = "ask", **extra: Any) -> dict[str, Any]:
    return {
        "kind": "approval.decided",
        "time": "2026-12-03T10:00:00Z",
        "request_id": f"r-{decision}-{by}",
        "payload": {"decision": decision, "by": by, "policy": {"decision": policy}, "shadow": shadow} | extra,
    }


def test_the_shadow_report_counts_agreement_and_disagreement() -> None:
    allow = [{"rule": "s", "would": "allow"}]
    asks = [{"rule": "t", "would": "ask"}]
    events = [
        decided("allow", "root", allow),  # agree: a person allowed what it would allow
        decided("allow", "reviewer site", allow),  # agree
        decided("deny", "root", allow),  # disagree
        decided("timeout", "timeout", allow),  # undecided
        decided("allow", "policy", asks, policy="allow"),  # disagree: a rule decided, it would ask
        decided("deny", "root", asks),  # agree: people were asked
        {"kind": "approval.pending", "payload": {"shadow": allow}},  # not a decision
        decided("allow", "root", []),
    ]
    rows = {row["rule"]: row for row in shadow_report(events, None)["rules"]}
    s, t = rows["s"], rows["t"]
    assert (s["matched"], s["agree"], s["disagree"], s["undecided"]) == (4, 2, 1, 1)
    assert s["outcomes"] == {"would allow": {"allowed": 2, "denied": 1, "undecided": 1}}
    assert s["disagreements"] == [{"request_id": "r-deny-root", "would": "allow", "decision": "deny", "by": "root"}]
    assert (t["matched"], t["agree"], t["disagree"]) == (2, 1, 1)
    assert shadow_report(events, since=2_000_000_000.0)["rules"] == []


def test_the_opinion_is_escaped_on_every_surface() -> None:
    opinion = {"name": "site", "decision": "allow", "reason": "ok \x1b[2J<!channel> *x*", "outcome": "answered"}
    line = render.reviewer_line(opinion)
    assert line.startswith("reviewer site: allow — ok ")
    assert "\x1b" not in render.sanitise(line)
    event = {
        "seq": 1,
        "time": "2026-12-03T10:00:00Z",
        "kind": "approval.pending",
        "request_id": "r-1",
        "peer_uid": 1000,
        "payload": {
            "rule": "r",
            "timeout_seconds": 60,
            "request": {"stages": [["/usr/bin/true"]]},
            "reviewer": opinion,
        },
    }
    message = msg.pending_message(event, "db1", str, 1_700_000_000.0)
    assert "\x1b" not in message["text"]
    assert "reviewer site: allow — ok \\x1b[2J<!channel>" in message["text"]
    slack = json.loads(Slack({"type": "slack", "name": "chat", "url": "http://h/"}).body(message))
    assert "<!channel>" not in json.dumps(slack["text"])


EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "reviewer-example.py"


def example_says(stages: list[list[str]]) -> str:
    """The shipped example reviewer's decision on a statement built as approval builds it."""
    text = reviewer.statement(
        request_id="r-1",
        request={"reason": "look"},
        spec={"stages": stages, "privileged": True, "env": {"LANG": "C"}},
        peer={"uid": 1000, "user": "agent", "groups": []},
        run_as={"uid": 0, "user": "root"},
        policy={"stages": [{"resolved": "/usr/bin/" + stage[0]} for stage in stages]},
        rule="ops",
        may="allow",
        bound={},
    )
    done = subprocess.run(
        [sys.executable, "-I", str(EXAMPLE)], input=json.dumps(text), capture_output=True, text=True, check=True
    )
    return str(json.loads(done.stdout)["decision"])


def test_the_example_reviewer_does_what_the_docs_say() -> None:
    assert example_says([["systemctl", "status", "nginx"]]) == "allow"
    assert example_says([["journalctl", "-u", "nginx", "--since", "-1h"]]) == "allow"
    assert example_says([["journalctl", "--vacuum-time=1s"]]) == "ask"
    assert example_says([["systemctl", "restart", "nginx"]]) == "ask"
    assert example_says([["cat", "/etc/shadow"]]) == "deny"
    assert example_says([["grep", "root", "/etc/./shadow"]]) == "deny"
    assert example_says([["journalctl", "-u", "x"], ["grep", "y"]]) == "ask"


def test_a_reviewers_decision_sends_no_follow_up() -> None:
    event = {"seq": 2, "kind": "approval.decided", "request_id": "r-1", "payload": {"decision": "allow"}}
    assert msg.decided_message(event | {"payload": {"decision": "allow", "by": "reviewer site"}}, "db1", None) is None
    assert msg.decided_message(event | {"payload": {"decision": "allow", "by": "root"}}, "db1", None) is not None


def test_watch_shows_the_opinion_escaped() -> None:
    from airlock.cli.watch import describe

    opinion = {"name": "site", "decision": "deny", "reason": "no \x1b]8;;http://x\x07link", "outcome": "answered"}
    shown = describe(
        {
            "request_id": "r1",
            "peer": {"user": "a", "uid": 1, "pid": 2},
            "privileged": False,
            "request": {"spec": {"stages": [["/usr/bin/true"]]}},
            "rule": "r",
            "operation_id": "op",
            "reviewer": opinion,
        },
        render.Style(False),
        1,
        1,
    )
    assert "site: deny — no \\x1b]8;;http://x\\x07link" in shown
    assert "\x1b" not in shown and "\x07" not in shown
