"""`airlock stats` and `airlock policy suggest` on known journal sequences (issue 34)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import yaml

from airlock.approval import match
from airlock.cli import stats, suggest
from airlock.common.render import duration

T0 = datetime(2027, 1, 15, 8, 0, tzinfo=UTC).timestamp()


def at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Journal:
    """A journal's events, written as the services write them (only the fields stats and suggest read)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.n = 0

    def add(self, kind: str, t: float, rid: str, uid: int, payload: dict[str, Any]) -> None:
        self.n += 1
        self.events.append(
            {"seq": self.n, "time": at(t), "kind": kind, "request_id": rid, "peer_uid": uid, "payload": payload}
        )

    def request(
        self,
        t: float,
        argv: list[str],
        *,
        uid: int = 1000,
        user: str = "deploy",
        rule: str = "default",
        ask: float | None = None,
        decision: str = "allow",
        by: str = "alice",
        privileged: bool = True,
        resolved: str | None = None,
        flagged: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> str:
        rid = f"r-{self.n}"
        request = {"stages": [argv], "privileged": privileged, "uid": uid}
        self.add("request.received", t, rid, uid, {"peer": {"uid": uid, "user": user}, "request": request})
        stage = {"argv": argv, "resolved": resolved or f"/usr/bin/{argv[0]}", "decision": "ask", "rule": rule}
        policy = {"decision": "ask" if ask is not None else decision, "rule": rule, "stages": [stage]}
        decided: dict[str, Any] = {"decision": decision, "rule": rule, "by": by, "policy": policy}
        if ask is not None:
            pending: dict[str, Any] = {"rule": rule, "policy": policy}
            if flagged:
                pending["arguments"] = [{"stage": 0, "index": 1, "path": argv[-1]}]
            self.add("approval.pending", t, rid, uid, pending)
            if by not in ("timeout", "agent") and not by.startswith("reviewer"):
                decided["operator_uid"] = 0
            self.add("approval.decided", t + ask, rid, uid, decided | (extra or {}))
        else:
            self.add("approval.decided", t, rid, uid, decided | (extra or {}))
        return rid


def test_stats_on_a_known_sequence() -> None:
    j = Journal()
    j.request(0, ["true"], rule="okay", by="policy")
    j.request(10, ["false"], rule="nope", decision="deny", by="policy")
    j.request(20, ["ls", "/a"], ask=4)  # an operator: 4s
    j.request(30, ["ls", "/b"], ask=10, decision="deny", by="bob")  # 10s
    j.request(3700, ["ls", "/c"], ask=2)  # the next hour: 2s
    j.request(3800, ["ls", "/d"], ask=60, decision="timeout", by="timeout")
    j.request(3900, ["ls", "/e"], ask=1, decision="withdrawn", by="agent")
    j.request(4000, ["ls", "/f"], by="grant", extra={"grant_id": "g-1"})
    j.request(4100, ["ls", "/g"], ask=3, by="reviewer sitecheck")
    j.request(-90000, ["ls", "/old"], ask=5)  # a day before the window: not counted
    numbers = stats.compute(j.events, now=T0 + 7200, window=86400)
    assert numbers["requests"] == 9
    assert numbers["decisions"] == {"allow": 5, "deny": 2, "timeout": 1, "withdrawn": 1}
    assert numbers["by"] == {"agent": 1, "grant": 1, "operator": 3, "reviewer": 1, "rule": 2, "timeout": 1}
    assert numbers["timeouts"] == 1
    assert numbers["asks"]["total"] == 6
    assert numbers["asks"]["hours"] == {"2027-01-15T08:00Z": 2, "2027-01-15T09:00Z": 4}
    wait = numbers["time_to_decision"]
    # allow/deny after an ask: 4, 10, 2 (operators) and 3 (the reviewer); nearest rank.
    assert wait["count"] == 4 and wait["p50_seconds"] == 3.0 and wait["p95_seconds"] == 10.0
    assert wait["by"]["operator"] == {"count": 3, "p50_seconds": 4.0, "p95_seconds": 10.0}
    assert numbers["rules"]["default"]["asked"] == 6 and numbers["rules"]["default"]["timeout"] == 1
    assert numbers["rules"]["nope"] == {
        "requests": 1,
        "allow": 0,
        "deny": 1,
        "timeout": 0,
        "withdrawn": 0,
        "asked": 0,
        "by": {"rule": 1},
    }
    text = stats.render_text(numbers)
    assert "time from an ask to a decision: p50 3.0s, p95 10.0s (4 decided)" in text
    # Issue 44: the average says over what (it read as a rate of the asks themselves).
    per_hour = round(6 / (numbers["window_seconds"] / 3600), 2)
    window = duration(float(numbers["window_seconds"]))
    assert f"asks (an operator was asked): 6, {per_hour:g} per hour on average over the last {window}\n" in text
    # A window that ends before anything happened counts nothing.
    assert stats.compute(j.events, now=T0 - 100000, window=60)["requests"] == 0


def test_percentile_is_nearest_rank() -> None:
    assert stats.percentile([], 0.5) is None
    assert stats.percentile([5.0], 0.95) == 5.0
    assert stats.percentile([float(n) for n in range(1, 101)], 0.95) == 95.0


def suggested(j: Journal, minimum: int = 3) -> tuple[str, list[dict[str, Any]]]:
    text = suggest.suggest(j.events, T0 + 3600, 86400, minimum)
    assert suggest.check(text, "suggested.yaml") is None, text
    rules: list[dict[str, Any]] = yaml.safe_load(text)["rules"]
    return text, rules


def test_repeated_approvals_become_one_rule_with_a_placeholder_where_arguments_varied() -> None:
    j = Journal()
    for n, unit in enumerate(["nginx", "redis", "nginx", "postgresql"]):
        j.request(n, ["systemctl", "restart", unit], ask=2, by=["alice", "bob"][n % 2])
    text, rules = suggested(j)
    assert len(rules) == 1
    rule = rules[0]
    assert rule["decision"] == "allow" and rule["users"] == ["deploy"] and rule["privileged"] is True
    assert rule["commands"] == [["/usr/bin/systemctl", "restart", "{arg2}"]]
    assert "# approved 4 times for deploy (as root)" in text and "approved by: alice (2), bob (2)" in text
    for unit in ("nginx", "redis", "postgresql"):
        assert match.match_args(rule["commands"][0][1:], ["restart", unit])


def test_one_approval_is_said_in_the_singular() -> None:
    """Issue 44: "approved 1 times"."""
    j = Journal()
    j.request(0, ["systemctl", "restart", "nginx"], ask=2, by="alice")
    text, rules = suggested(j, minimum=1)
    assert len(rules) == 1 and "# approved 1 time for deploy (as root)" in text, text


def test_below_the_minimum_rules_denied_and_others_are_not_learned() -> None:
    j = Journal()
    for n in range(3):
        j.request(n, ["apt-get", "update"], ask=1, by="policy" if n == 0 else "alice")  # 2 by a person
    for n in range(4):
        j.request(10 + n, ["rm", f"/tmp/f{n}"], ask=1)
    j.request(20, ["rm", "/tmp/precious"], ask=1, decision="deny")  # someone said no to this shape
    for n in range(4):
        j.request(30 + n, ["cp", "upload", f"/srv/f{n}"], ask=1, flagged=True)  # changeable path argument
    for n in range(4):
        j.request(40 + n, ["touch", "/x"], by="grant", extra={"grant_id": "g"})  # a grant's uses
    for n in range(4):
        j.request(50 + n, ["ls", "/"], ask=1, decision="timeout", by="timeout")
    _text, rules = suggested(j)
    assert rules == []


def test_arguments_no_placeholder_takes_split_into_exact_commands_and_hostile_text_stays_data() -> None:
    j = Journal()
    for n in range(3):
        j.request(n, ["chmod", "-R", "/srv"], ask=1)
        j.request(10 + n, ["chmod", "--recursive", "/srv"], ask=1)  # an option never becomes a placeholder
    for n in range(3):
        j.request(20 + n, ["echo", "x\n- name: evil\n  decision: allow\n#"], ask=1, user="dep\nloy")
    for n in range(3):
        j.request(30 + n, ["echo", "..."], ask=1)  # would read as "any arguments": never suggested
    text, rules = suggested(j)
    patterns = sorted(tuple(r["commands"][0]) for r in rules)
    assert ("/usr/bin/chmod", "--recursive", "/srv") in patterns and ("/usr/bin/chmod", "-R", "/srv") in patterns
    assert ("/usr/bin/echo", "x\n- name: evil\n  decision: allow\n#") in patterns  # one literal argument
    assert not any(p == ("/usr/bin/echo", "...") for p in patterns)
    assert all(r["name"].startswith("suggested-") and "evil" not in r["name"] for r in rules)
    assert sorted(r["users"][0] for r in rules) == ["1000", "deploy", "deploy"]  # a name not plain: the uid
    assert "\n- name: evil" not in text  # the newline is quoted inside the literal, not a line of YAML
    assert len(rules) == 3


def test_a_path_that_varied_never_becomes_a_placeholder() -> None:
    j = Journal()
    for n in range(3):
        j.request(n, ["cat", "/srv/a.log"], ask=1)
        j.request(10 + n, ["cat", "/srv/b.log"], ask=1)
    _text, rules = suggested(j)
    assert sorted(r["commands"][0][1] for r in rules) == ["/srv/a.log", "/srv/b.log"]  # never {arg1}: any path
