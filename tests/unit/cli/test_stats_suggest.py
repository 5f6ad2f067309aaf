"""`airlock stats` and `airlock policy suggest` on known journal sequences (issue 34).

Issue 45 item 5 as a hypothesis property at the end: journals of approvals and denials (arguments from a
pool of file names, paths, ``..``, options; several working directories and stdins) are suggested from,
the file is loaded with approval's own loader, and every request a suggested rule allows must be, up to
its placeholders' constraints, one that people approved: the same agent, binary, working directory and
stdin, and each argument the approved one or interchangeable with it under the constraint (both a plain
file name, or both a file name in the same directory).
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.approval import match
from airlock.approval.policyfile import parse_policy_text
from airlock.approval.rules import Policy, Subject
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
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> str:
        rid = f"r-{self.n}"
        request: dict[str, Any] = {"stages": [argv], "privileged": privileged, "uid": uid}
        if cwd is not None:
            request["cwd"] = cwd
        if stdin is not None:
            request["stdin"] = base64.b64encode(stdin).decode()
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
    assert rule["commands"] == [["/usr/bin/systemctl", "restart", "{arg2:file}"]]
    assert (rule["cwd"], rule["stdin"]) == ("none", "none")  # pinned as approved: none given
    assert "# approved 4 times for deploy (as root)" in text and "approved by: alice (2), bob (2)" in text
    assert "# cwd: none given; stdin: none (both pinned, as approved)" in text
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


def test_a_path_that_varied_keeps_its_directory_and_takes_only_a_file_name() -> None:
    j = Journal()
    for n in range(3):
        j.request(n, ["cat", "/srv/a.log"], ask=1)
        j.request(10 + n, ["cat", "/srv/b.log"], ask=1)
        j.request(20 + n, ["cat", f"/srv/{n}/c.log" if n else "/etc/c.log"], ask=1, user="other")
    _text, rules = suggested(j)
    mine = [r for r in rules if r["users"] == ["deploy"]]
    assert [r["commands"][0] for r in mine] == [["/usr/bin/cat", "/srv/{arg1:file}"]]
    pattern = mine[0]["commands"][0][1:]
    for hostile in ("/etc/shadow", "/srv/../etc/shadow", "/srv/x/y", "/srv/", "/srv/..", "/srvx/a.log", "a.log"):
        assert not match.match_args(pattern, [hostile]), hostile
    assert match.match_args(pattern, ["/srv/new.log"])
    # Values in different directories: no placeholder, each exact command on its own (below --min here).
    assert not [r for r in rules if r["users"] == ["other"]]


def test_5a_relative_file_names_pin_the_cwd_they_were_approved_in() -> None:
    j = Journal()
    for n in range(5):
        j.request(n, ["cat", f"a{n}.log"], ask=1, cwd="/srv/app/logs")
    text, rules = suggested(j)
    (rule,) = rules
    assert rule["commands"] == [["/usr/bin/cat", "{arg1:file}"]] and rule["cwd"] == "/srv/app/logs"
    assert "# cwd: /srv/app/logs; stdin: none" in text
    for hostile in ("/srv/app/secret/token", "../secret/token", "..", "-n"):
        assert not match.match_args(rule["commands"][0][1:], [hostile]), hostile


def test_5b_stdin_is_pinned_by_its_digest_or_not_learned() -> None:
    j = Journal()
    motd = b"Welcome to app1\n"
    for n in range(5):
        j.request(n, ["tee", "/srv/app/motd"], ask=1, stdin=motd)
    for n in range(5):  # different input each time: no one input was approved often enough
        j.request(10 + n, ["tee", "/srv/app/issue"], ask=1, stdin=f"text {n}\n".encode())
    for n in range(5):  # stdin journaled in a form that gives no digest: not learned
        j.request(20 + n, ["tee", "/srv/app/other"], ask=1, extra=None, stdin=None)
        j.events[-3]["payload"]["request"]["stdin"] = {"bytes": 3}
    text, rules = suggested(j)
    (rule,) = rules
    digest = hashlib.sha256(motd).hexdigest()
    assert rule["commands"] == [["/usr/bin/tee", "/srv/app/motd"]] and rule["stdin"] == f"sha256:{digest}"
    assert f"stdin: sha256 {digest} (only this exact input)" in text


def test_a_journaled_digest_is_used_as_it_is() -> None:
    j = Journal()
    digest = "ab" * 32
    for n in range(3):
        j.request(n, ["tee", "/srv/x"], ask=1)
        j.events[-3]["payload"]["request"]["stdin"] = {"sha256": digest, "bytes": 12}
    _text, rules = suggested(j)
    assert [r["stdin"] for r in rules] == [f"sha256:{digest}"]


# -- issue 45 item 5, as a property: every request a suggested rule allows was approved ------------------------
VALUES = [
    "a.log",
    "b.log",
    "nginx",
    "/srv/app/a.log",
    "/srv/app/b.log",
    "/srv/app/sub/c.log",
    "/etc/shadow",
    "..",
    ".",
    "sub/c.log",
    "-n",
    "/srv/app/..",
]
HOSTILE = [*VALUES, "/srv/app/../secret", "/srv/app/x/y", "/srv/apps/a", "token", "/srv/app/", "../a.log", "/a.log"]
CWDS = [None, "/srv/app", "/tmp"]
STDINS = [None, b"hello\n", b"other\n"]

approval = st.tuples(
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=2),
    st.sampled_from(CWDS),
    st.sampled_from(STDINS),
    st.sampled_from(["allow", "allow", "allow", "deny"]),
)
request = st.tuples(
    st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=2), st.sampled_from(CWDS), st.sampled_from(STDINS)
)


def _same_under_constraint(asked: str, approved: str) -> bool:
    if asked == approved:
        return True
    if match.file_name_accepts(asked) and match.file_name_accepts(approved):
        return True
    head, _, name = asked.rpartition("/")
    other_head, _, other_name = approved.rpartition("/")
    return (
        head == other_head
        and head.startswith("/")
        and match.file_name_accepts(name)
        and match.file_name_accepts(other_name)
    )


def _digest(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


@settings(max_examples=150, deadline=None)
@given(st.lists(approval, min_size=1, max_size=14), st.lists(request, min_size=1, max_size=25))
def test_every_request_a_suggested_rule_allows_was_approved(
    approvals: list[tuple[list[str], str | None, bytes | None, str]],
    requests: list[tuple[list[str], str | None, bytes | None]],
) -> None:
    j = Journal()
    for n, (args, cwd, stdin, decision) in enumerate(approvals):
        j.request(n, ["cat", *args], ask=1, decision=decision, cwd=cwd, stdin=stdin)
    text = suggest.suggest(j.events, T0 + 3600, 86400, 2)
    assert suggest.check(text, "suggested.yaml") is None, text
    rules = parse_policy_text(text, "suggested.yaml", main=False).rules
    policy = Policy(default="deny", rules=rules, sources=())
    approved = [(a, c, _digest(s)) for a, c, s, d in approvals if d == "allow"]
    for args, cwd, stdin in requests:
        subject = Subject(
            uid=1000,
            user="deploy",
            groups=frozenset(),
            session=None,
            privileged=True,
            target_uid=0,
            cwd=cwd,
            stdin_sha256=_digest(stdin),
        )
        decided = policy.decide(subject, [("cat", *args)], resolver=lambda name, path: "/usr/bin/cat")
        if decided.decision != "allow":
            continue
        assert any(
            (c, s) == (cwd, _digest(stdin))
            and len(a) == len(args)
            and all(_same_under_constraint(x, y) for x, y in zip(args, a, strict=True))
            for a, c, s in approved
        ), (args, cwd, stdin, text)


def test_the_wire_form_of_stdin_is_what_the_journal_holds() -> None:
    # The helper writes stdin as the agent sent it (base64): the digest suggest pins is of the bytes.
    j = Journal()
    j.request(0, ["cat"], ask=1, stdin=b"x")
    payload: dict[str, Any] = j.events[0]["payload"]["request"]
    assert base64.b64decode(payload["stdin"]) == b"x"
