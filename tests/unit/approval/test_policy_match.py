"""Deciding: each matching rule of issue 6, one at a time."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from airlock.approval import match
from airlock.approval.policy import assemble
from airlock.approval.policyfile import parse_policy_text
from airlock.approval.rules import (
    DEFAULT_RULE,
    UNRESOLVED_RULE,
    Decision,
    Policy,
    Rule,
    Subject,
)

TRUE = os.path.realpath("/usr/bin/true")
DASH = os.path.realpath("/bin/sh")


def subject(
    user: str = "deploy",
    uid: int = 1000,
    groups: frozenset[str] = frozenset({"deploy"}),
    session: str | None = None,
    privileged: bool = False,
) -> Subject:
    return Subject(uid, user, groups, session, privileged, 0 if privileged else uid)


def policy(body: str, default: str = "ask") -> Policy:
    text = f"policy:\n  default: {default}\n  rules:\n" + "\n".join(
        "    " + line for line in body.strip("\n").splitlines()
    )
    return assemble([parse_policy_text(text, "/etc/airlock/airlock.yaml", main=True)])


def decide(p: Policy, *stages: list[str], who: Subject | None = None) -> Decision:
    return p.decide(who or subject(), stages)


APT = policy(
    """
- name: apt-refresh
  decision: allow
  commands:
    - [/usr/bin/apt-get, update]
    - [/usr/bin/apt-get, install, "{pkg}"]
    - [/usr/bin/journalctl, "..."]
"""
)


def fake_resolver(name: str, search_path: str) -> str | None:
    # Resolution without depending on what this machine has installed.
    return name if name.startswith("/") else f"/usr/bin/{name}"


# --- placeholders ---------------------------------------------------------------


@pytest.mark.parametrize("arg", ["nginx", "libc6:amd64", "python3.11", "pkg=1.0", "a/b", "./x", "x.."])
def test_placeholder_accepts_plain_arguments(arg: str) -> None:
    assert APT.decide(subject(), [["/usr/bin/apt-get", "install", arg]], resolver=fake_resolver).decision == "allow"


@pytest.mark.parametrize(
    "arg",
    [
        "-o",
        "--option=APT::Update::Pre-Invoke::=sh",
        "-",
        "",
        "..",
        "../etc/shadow",
        "a/../b",
        "a/..",
        "x;reboot",
        "x&&y",
        "x|y",
        "$(id)",
        "`id`",
        "a b",
        "a\tb",
        "a\nb",
        "a\u00a0b",
        "x>y",
        "x'",
        'x"',
        "*",
        "x?",
        "[x]",
        "{x}",
        "!x",
        "#x",
        "~root",
        "a\\b",
        "\x1b[31m",
    ],
)
def test_placeholder_refuses_dangerous_arguments(arg: str) -> None:
    decision = APT.decide(subject(), [["/usr/bin/apt-get", "install", arg]], resolver=fake_resolver)
    assert (decision.decision, decision.rule) == ("ask", DEFAULT_RULE)


def test_placeholder_is_exactly_one_argument() -> None:
    for args in (["install"], ["install", "a", "b"]):
        assert decide(APT, ["/usr/bin/apt-get", *args]).rule == DEFAULT_RULE
    assert decide(APT, ["/usr/bin/apt-get", "install", "nginx"]).rule == "apt-refresh"


def test_literals_match_exactly() -> None:
    assert decide(APT, ["apt-get", "update"]).decision == "allow"
    for args in (["Update"], ["update", "-y"], ["-y", "update"], ["update "], []):
        assert decide(APT, ["apt-get", *args]).rule == DEFAULT_RULE


# --- "..." ------------------------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["-u", "nginx"], ["--since", "1 hour ago", "-o", "json", "a;b", ""]])
def test_rest_matches_zero_or_many_arguments(args: list[str]) -> None:
    decision = decide(APT, ["/usr/bin/journalctl", *args])
    assert (decision.decision, decision.rule) == ("allow", "apt-refresh")


def test_rest_needs_the_literals_before_it() -> None:
    p = policy('- {name: r, decision: allow, commands: [[/usr/bin/systemctl, status, "..."]]}')
    assert p.decide(subject(), [["systemctl", "status"]], resolver=fake_resolver).rule == "r"
    assert p.decide(subject(), [["systemctl"]], resolver=fake_resolver).rule == DEFAULT_RULE
    assert p.decide(subject(), [["systemctl", "restart", "x"]], resolver=fake_resolver).rule == DEFAULT_RULE


# --- binaries ------------------------------------------------------------------------


def test_symlinked_binary_matches_the_rule_for_its_target(tmp_path: Path) -> None:
    link = tmp_path / "innocent-name"
    link.symlink_to("/bin/true")
    p = policy(f"- {{name: t, decision: deny, commands: [[{TRUE}]]}}", default="allow")
    decision = decide(p, [str(link)])
    assert (decision.decision, decision.rule, decision.stages[0].resolved) == ("deny", "t", TRUE)


def test_rule_written_with_a_symlink_matches_the_canonical_binary(tmp_path: Path) -> None:
    link = tmp_path / "mytrue"
    link.symlink_to("/bin/true")
    p = policy(f"- {{name: t, decision: allow, commands: [[{link}]]}}")
    assert p.rules[0].commands == ((TRUE,),)
    assert decide(p, ["true"]).decision == "allow"
    assert decide(p, ["/bin/true"]).decision == "allow"


def test_rule_for_a_missing_binary_is_kept_and_warned(tmp_path: Path) -> None:
    missing = tmp_path / "not-installed"
    p = policy(f"- {{name: t, decision: allow, commands: [[{missing}]]}}")
    assert p.rules[0].commands == ((str(missing),),)
    assert len(p.warnings) == 1 and "no executable" in p.warnings[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the binary to another owner")
def test_a_root_only_rule_for_a_binary_others_can_change_is_warned(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    os.chown(tool, 65534, 65534)
    p = policy(f"- {{name: t, decision: allow, privileged: true, commands: [[{tool}]]}}")
    assert len(p.warnings) == 1 and "unsafe_binary" in p.warnings[0] and "owned by uid 65534" in p.warnings[0]
    # Either privilege, or unprivileged only: it may run as the agent, no warning.
    assert not policy(f"- {{name: t, decision: allow, commands: [[{tool}]]}}").warnings
    assert not policy(f"- {{name: t, decision: allow, privileged: false, commands: [[{tool}]]}}").warnings


def test_bare_names_resolve_on_the_target_users_path() -> None:
    seen: list[str] = []

    def resolver(name: str, search_path: str) -> str | None:
        seen.append(search_path)
        return None

    APT.decide(subject(privileged=True), [["x"]], resolver=resolver)
    APT.decide(subject(privileged=False), [["x"]], resolver=resolver)
    assert "/usr/sbin" in seen[0] and "sbin" not in seen[1]


def test_relative_and_unresolvable_binaries_are_denied() -> None:
    p = policy("- {name: anything, decision: allow, commands: [[/usr/bin/true, '...']]}", default="allow")
    for argv0 in ("./true", "bin/true", "no-such-binary-here", "/nonexistent/true"):
        decision = decide(p, [argv0])
        assert (decision.decision, decision.rule, decision.stages[0].resolved) == ("deny", UNRESOLVED_RULE, None)


def test_unresolvable_binary_is_denied_by_a_rule_without_commands_or_as_unresolved() -> None:
    p = policy(
        "- {name: root-all, decision: allow, users: [root]}\n- {name: mallory, decision: deny, users: [mallory]}\n"
        "- {name: carol-asks, decision: ask, users: [carol]}"
    )
    assert decide(p, ["no-such-binary-here"], who=subject("mallory", 1001)).rule == "mallory"
    # Issue 44: a rule's allow (or ask) of a program that is not there is no permission to run nothing:
    # it is "command not found" (unresolved), not an allow the runner then fails as spawn_failed.
    for who in (subject("root", 0), subject("carol", 1002)):
        decision = decide(p, ["no-such-binary-here"], who=who)
        assert (decision.decision, decision.rule) == ("deny", UNRESOLVED_RULE), who
        assert decision.stages[0].matched  # the rules that matched are still named


def test_shell_form_matches_through_the_canonical_shell() -> None:
    p = policy(
        """
- name: disk-report
  decision: allow
  commands:
    - [/bin/sh, -c, "df -h | sort"]
"""
    )
    assert p.rules[0].commands == ((DASH, "-c", "df -h | sort"),)
    for sh in ("/bin/sh", "sh", "/usr/bin/sh", DASH):
        assert decide(p, [sh, "-c", "df -h | sort"]).decision == "allow", sh
    assert decide(p, ["/bin/sh", "-c", "df -h | sort; reboot"]).rule == DEFAULT_RULE


# --- pipelines and restrictiveness ---------------------------------------------------


def test_pipeline_with_one_unmatched_stage_takes_the_default() -> None:
    p = policy("- {name: t, decision: allow, commands: [[/usr/bin/true]]}", default="ask")
    decision = decide(p, ["true"], ["cat"])
    assert (decision.decision, decision.rule) == ("ask", DEFAULT_RULE)
    assert [(s.decision, s.rule) for s in decision.stages] == [("allow", "t"), ("ask", DEFAULT_RULE)]
    assert decide(p, ["true"], ["true"]).decision == "allow"


def test_deny_beats_allow_within_one_stage() -> None:
    p = policy(
        """
- {name: allow-apt, decision: allow, commands: [[/usr/bin/apt-get, "..."]]}
- {name: no-purge, decision: deny, commands: [[/usr/bin/apt-get, purge, "..."]]}
- {name: ask-purge, decision: ask, commands: [[/usr/bin/apt-get, purge, "{pkg}"]]}
"""
    )
    decision = p.decide(subject(), [["apt-get", "purge", "nginx"]], resolver=fake_resolver)
    assert (decision.decision, decision.rule) == ("deny", "no-purge")
    assert decision.stages[0].matched == ("allow-apt", "ask-purge", "no-purge")
    assert p.decide(subject(), [["apt-get", "update"]], resolver=fake_resolver).rule == "allow-apt"


def test_pipeline_takes_its_most_restrictive_stage() -> None:
    p = policy(
        """
- {name: a-allow, decision: allow, commands: [[/usr/bin/cat, "..."]]}
- {name: b-ask, decision: ask, commands: [[/usr/bin/sort, "..."]]}
- {name: c-deny, decision: deny, commands: [[/usr/bin/tee, "..."]]}
""",
        default="allow",
    )

    def run(*names: str) -> Decision:
        return p.decide(subject(), [[n] for n in names], resolver=fake_resolver)

    assert (run("cat", "sort").decision, run("cat", "sort").rule) == ("ask", "b-ask")
    assert run("tee", "cat", "sort").rule == "c-deny"
    assert run("cat", "unknown").rule == "a-allow"  # default allow does not outrank the rule's name
    assert run("sort", "cat").rule == run("cat", "sort").rule


def test_equal_stages_are_named_by_the_first_rule_name() -> None:
    p = policy(
        """
- {name: zeta, decision: deny, commands: [[/usr/bin/a]]}
- {name: alpha, decision: deny, commands: [[/usr/bin/b]]}
""",
    )
    for order in (["a", "b"], ["b", "a"]):
        assert p.decide(subject(), [[n] for n in order], resolver=fake_resolver).rule == "alpha"


def test_a_real_rule_is_named_before_the_default_at_equal_restrictiveness() -> None:
    p = policy("- {name: zz, decision: deny, commands: [[/usr/bin/a]]}", default="deny")
    assert p.decide(subject(), [["b"], ["a"]], resolver=fake_resolver).rule == "zz"


def test_empty_pipeline_or_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="a pipeline needs at least one stage"):
        APT.decide(subject(), [])
    with pytest.raises(ValueError, match="every stage an argv"):
        APT.decide(subject(), [["true"], []])


# --- subject conditions ---------------------------------------------------------------


WHO = policy(
    """
- {name: by-user, decision: allow, users: [deploy, 1234]}
- {name: by-group, decision: allow, groups: [agents, ops]}
- {name: by-session, decision: allow, sessions: [nightly]}
- {name: root-only, decision: allow, privileged: true, users: [alice]}
- {name: unpriv-only, decision: allow, privileged: false, users: [bob]}
- {name: all-of, decision: allow, users: [carol], groups: [agents], sessions: [s1], privileged: false}
""",
    default="deny",
)


def rule_for(who: Subject) -> str:
    return WHO.decide(who, [["/usr/bin/true"]]).rule


def test_users_by_name_or_uid() -> None:
    assert rule_for(subject("deploy", 1)) == "by-user"
    assert rule_for(subject("someone", 1234)) == "by-user"
    assert rule_for(subject("someone", 4321)) == DEFAULT_RULE


def test_groups_any_of() -> None:
    assert rule_for(subject("x", 5, frozenset({"users", "ops"}))) == "by-group"
    assert rule_for(subject("x", 5, frozenset({"users"}))) == DEFAULT_RULE


def test_sessions_exact_and_never_without_a_session() -> None:
    assert rule_for(subject("x", 5, session="nightly")) == "by-session"
    assert rule_for(subject("x", 5, session="Nightly")) == DEFAULT_RULE
    assert rule_for(subject("x", 5, session=None)) == DEFAULT_RULE


def test_privileged_true_false_and_either() -> None:
    assert rule_for(subject("alice", 5, privileged=True)) == "root-only"
    assert rule_for(subject("alice", 5, privileged=False)) == DEFAULT_RULE
    assert rule_for(subject("bob", 6, privileged=False)) == "unpriv-only"
    assert rule_for(subject("bob", 6, privileged=True)) == DEFAULT_RULE
    assert rule_for(subject("deploy", 1, privileged=True)) == "by-user"


def test_all_present_conditions_must_hold() -> None:
    good = subject("carol", 7, frozenset({"agents"}), "s1", False)
    assert WHO.decide(good, [["/usr/bin/true"]]).stages[0].matched == ("all-of", "by-group")
    for bad in (
        subject("carol", 7, frozenset({"other"}), "s1", False),
        subject("carol", 7, frozenset({"agents"}), "s2", False),
        subject("carol", 7, frozenset({"agents"}), "s1", True),
        subject("dave", 8, frozenset({"agents"}), "s1", False),
    ):
        assert "all-of" not in WHO.decide(bad, [["/usr/bin/true"]]).stages[0].matched


def test_rules_built_in_code_are_checked_and_canonicalised() -> None:
    rule = Rule("sh", "allow", frozenset(), frozenset(), frozenset(), None, (("/bin/sh", "-c", "..."),), "<code>")
    assert rule.commands == ((DASH, "-c", "..."),)
    p = Policy("deny", (rule,), ())
    assert p.decide(subject(), [["sh", "-c", "id"]]).rule == "sh"
    with pytest.raises(ValueError, match="only allowed as the last"):
        Rule("x", "allow", frozenset(), frozenset(), frozenset(), None, (("/bin/x", "...", "y"),), "<code>")
    with pytest.raises(ValueError, match="decision"):
        Rule("x", "maybe", frozenset(), frozenset(), frozenset(), None, None, "<code>")  # type: ignore[arg-type]


# --- to_dict ------------------------------------------------------------------


def test_to_dict_is_plain_json() -> None:
    decision = decide(APT, ["apt-get", "update"])
    assert decision.to_dict() == {
        "decision": "allow",
        "rule": "apt-refresh",
        "stages": [
            {
                "argv": ["apt-get", "update"],
                "resolved": "/usr/bin/apt-get",
                "decision": "allow",
                "rule": "apt-refresh",
                "matched": ["apt-refresh"],
                "deciding": ["apt-refresh"],
                "sandbox": None,
            }
        ],
    }


# --- files: (issue 10) ---------------------------------------------------------------------


def test_file_rules(tmp_path: Path) -> None:
    tree = tmp_path / "nginx"
    (tree / "sites").mkdir(parents=True)
    (tmp_path / "secret").write_text("x")
    (tree / "escape").symlink_to(tmp_path / "secret")
    p = policy(
        f"""
- name: read-nginx
  decision: allow
  files:
    - {{tools: [files_read, files_list], paths: [{tree}/...]}}
- name: edit-main
  decision: ask
  files:
    - {{tools: [files_edit], paths: [{tree}/nginx.conf]}}
- {{name: any-command, decision: allow, commands: [[/usr/bin/true]]}}
""",
        default="deny",
    )
    who = subject()
    assert p.decide_file(who, "files_read", f"{tree}/sites/default").rule == "read-nginx"
    assert p.decide_file(who, "files_list", str(tree)).rule == "read-nginx"
    assert p.decide_file(who, "files_read", f"{tree}/../secret").rule == DEFAULT_RULE
    assert p.decide_file(who, "files_read", f"{tree}/escape").rule == DEFAULT_RULE
    assert p.decide_file(who, "files_read", f"{tree}x/a").rule == DEFAULT_RULE
    assert p.decide_file(who, "files_write", f"{tree}/nginx.conf").rule == DEFAULT_RULE
    assert p.decide_file(who, "files_edit", f"{tree}/nginx.conf").decision == "ask"
    assert p.decide_file(who, "files_edit", f"{tree}/other.conf").rule == DEFAULT_RULE
    assert p.decide_file(who, "files_read", "relative/path").rule == UNRESOLVED_RULE
    assert p.decide_file(who, "rm", f"{tree}/x").rule == UNRESOLVED_RULE
    # A files-only rule never allows commands, a commands-only rule never files.
    assert decide(p, ["cat", f"{tree}/nginx.conf"]).rule == DEFAULT_RULE
    assert "any-command" not in p.decide_file(who, "files_read", "/usr/bin/true").stages[0].matched


def test_rule_without_commands_or_files_covers_both() -> None:
    p = policy("- {name: ops, decision: allow, groups: [ops]}", default="deny")
    ops = subject("o", 9, frozenset({"ops"}))
    assert p.decide_file(ops, "files_write", "/etc/hosts").rule == "ops"
    # ...but never for an unknown tool or a relative path.
    assert p.decide_file(ops, "rm", "/etc/hosts").rule == UNRESOLVED_RULE
    assert p.decide_file(ops, "files_read", "hosts").rule == UNRESOLVED_RULE
    assert decide(p, ["true"], who=ops).rule == "ops"


def test_path_matching_helpers() -> None:
    assert match.match_path("/", True, "/etc")
    assert match.match_path("/etc", True, "/etc")
    assert not match.match_path("/etc", True, "/etcx")
    assert not match.match_path("/etc/hosts", False, "/etc/hosts/x")


_FLIPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
print("flipping", flush=True)
while True:
    libc.renameat2(-100, a, -100, b, 2)  # RENAME_EXCHANGE
"""


def test_a_link_flipping_while_a_file_path_is_decided_is_a_denial_not_an_error(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    (tmp_path / "d").mkdir()
    (tmp_path / "L").symlink_to(tmp_path / "d-target")
    (tmp_path / "d-target").mkdir()
    p = policy(
        f"- {{name: work, decision: allow, files: [{{tools: [files_read], paths: [{tmp_path}/...]}}]}}", default="deny"
    )
    flipper = subprocess.Popen(
        [sys.executable, "-I", "-c", _FLIPPER, str(tmp_path / "d"), str(tmp_path / "L")],
        stdout=subprocess.PIPE,
        text=True,
    )
    raised = 0
    rules = set()
    try:
        assert flipper.stdout is not None and flipper.stdout.readline().strip() == "flipping"
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not (raised >= 20 and UNRESOLVED_RULE in rules):
            try:
                os.path.realpath(tmp_path / "d" / "f")  # control: the naive canonicalisation fails now and then
            except OSError:
                raised += 1
            rules.add(p.decide_file(subject(), "files_read", f"{tmp_path}/d/f").rule)  # never raises
            decide(p, [f"{tmp_path}/d/f"])  # nor does resolving a command's binary through the link
    finally:
        flipper.kill()
        flipper.wait()
    assert rules <= {"work", UNRESOLVED_RULE, DEFAULT_RULE}
    if not raised:
        pytest.skip("the link never flipped between lstat and readlink within 8 s: nothing was shown")


@pytest.mark.parametrize(
    ("element", "arg", "matches"),
    [
        ("{f:file}", "a.log", True),
        ("{f:file}", "/etc/shadow", False),
        ("{f:file}", "sub/a.log", False),
        ("{f:file}", "..", False),
        ("{f:file}", ".", False),
        ("{f:file}", "-n", False),
        ("/srv/logs/{f:file}", "/srv/logs/a.log", True),
        ("/srv/logs/{f:file}", "/srv/logs/../secret", False),
        ("/srv/logs/{f:file}", "/srv/logs/x/y", False),
        ("/srv/logs/{f:file}", "/srv/logsx/a.log", False),
        ("/srv/logs/{f:file}", "/srv/logs/", False),
        ("/srv/logs/{f:file}", "a.log", False),
        ("--format={a:b}", "--format={a:b}", True),  # a literal that ends in braces stays a literal
    ],
)
def test_file_placeholders_take_one_file_name(element: str, arg: str, matches: bool) -> None:
    assert match.pattern_problem(["/usr/bin/cat", element]) is None
    assert match.match_args([element], [arg]) is matches


def test_a_rule_pins_cwd_and_stdin() -> None:
    rule = Rule("r", "allow", frozenset(), frozenset(), frozenset(), None, None, "t:1", cwd="/", stdin="none")
    base = Subject(uid=1, user="u", groups=frozenset(), session=None, privileged=False, target_uid=1)
    assert not rule.applies_to(base)  # no cwd given is not "/"
    assert rule.applies_to(dataclasses.replace(base, cwd="/"))
    assert not rule.applies_to(dataclasses.replace(base, cwd="/", stdin_sha256="0" * 64))
    assert not rule.applies_to(dataclasses.replace(base, cwd="/tmp/../"))  # not canonical as asked
    assert Rule("n", "allow", frozenset(), frozenset(), frozenset(), None, None, "t:1", cwd="none").applies_to(base)
