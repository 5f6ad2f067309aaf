"""Loading: airlock.yaml's policy: node plus policy.d, and exact error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from airlock.approval.policy import assemble, load_policy
from airlock.approval.policyfile import PolicyError, parse_policy_text
from airlock.approval.rules import Policy
from airlock.common import config as cfg

D = "/etc/airlock/policy.d/10-apt.yaml"


def dropin_error(text: str) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(text, D, main=False)
    return str(info.value)


def load(tmp_path: Path, main: str, dropins: dict[str, str]) -> Policy:
    policy_dir = tmp_path / "policy.d"
    policy_dir.mkdir(exist_ok=True)
    for name, text in dropins.items():
        (policy_dir / name).write_text(text)
    main_path = tmp_path / "airlock.yaml"
    main_path.write_text(f"paths:\n  policy_dir: {policy_dir}\n" + main)
    return load_policy(cfg.load(main_path))


# --- what loads ----------------------------------------------------------------------


ISSUE_EXAMPLE = """\
policy:
  default: ask            # when no rule matches: allow | ask | deny
  rules:
    - name: apt-refresh   # required, unique across all files
      decision: allow     # allow | ask | deny
      users: [deploy]     # optional: peer user names or uids
      groups: [agents]    # optional: the peer belongs to any of them
      sessions: [nightly] # optional: exact session names
      privileged: true    # optional: absent means either
      commands:           # optional: absent means any command
        - [/usr/bin/apt-get, update]
        - [/usr/bin/apt-get, install, "{pkg}"]
        - [/usr/bin/journalctl, "..."]
"""


def test_the_issue_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "airlock.yaml"
    path.write_text(ISSUE_EXAMPLE)
    policy = load_policy(cfg.load(path))
    assert policy.default == "ask"
    (rule,) = policy.rules
    assert (rule.name, rule.decision, rule.privileged) == ("apt-refresh", "allow", True)
    assert (rule.users, rule.groups, rule.sessions) == (
        frozenset({"deploy"}),
        frozenset({"agents"}),
        frozenset({"nightly"}),
    )
    assert rule.commands == (
        ("/usr/bin/apt-get", "update"),
        ("/usr/bin/apt-get", "install", "{pkg}"),
        ("/usr/bin/journalctl", "..."),
    )
    assert rule.source == f"{path}:4"
    assert policy.sources == (str(path),)


def test_built_in_config_means_default_ask_and_no_rules() -> None:
    policy = load_policy(cfg.defaults())  # /etc/airlock/policy.d is absent here
    assert (policy.default, policy.rules) == ("ask", ())


def test_policy_d_files_are_read_in_name_order_and_others_ignored(tmp_path: Path) -> None:
    policy = load(
        tmp_path,
        "policy:\n  default: deny\n",
        {
            "20-b.yaml": "rules:\n  - {name: b, decision: allow}\n",
            "10-a.yaml": "rules:\n  - {name: a, decision: ask}\n",
            "30-empty.yaml": "",
            "40-null-rules.yaml": "rules:\n",
            "README": "not: policy",
            "50-x.yaml.dpkg-old": "garbage: [",
            ".hidden.yaml": "garbage: [",
        },
    )
    assert policy.default == "deny"
    assert [r.name for r in policy.rules] == ["a", "b"]
    assert [Path(s).name for s in policy.sources] == [
        "airlock.yaml",
        "10-a.yaml",
        "20-b.yaml",
        "30-empty.yaml",
        "40-null-rules.yaml",
    ]


def test_missing_policy_dir_is_fine(tmp_path: Path) -> None:
    main = tmp_path / "airlock.yaml"
    main.write_text(f"paths:\n  policy_dir: {tmp_path / 'nope'}\npolicy:\n  rules: [{{name: x, decision: deny}}]\n")
    assert [r.name for r in load_policy(cfg.load(main)).rules] == ["x"]


def test_users_may_be_numbers_but_not_lists() -> None:
    assert dropin_error("rules: [{name: x, decision: allow, users: [[a]]}]") == (
        f"{D}:1:44: rules[0] (x).users[0]: expected a user name or uid (got a list)"
    )


def test_users_may_be_numbers_and_values_are_normalised() -> None:
    f = parse_policy_text("rules: [{name: x, decision: allow, users: [0, root, 1000, '0x10']}]", D, main=False)
    assert f.rules[0].users == frozenset({"0", "root", "1000", "0x10"})
    assert dropin_error("rules: [{name: x, decision: allow, users: [010]}]") == (
        f"{D}:1:44: rules[0] (x).users[0]: a uid is a plain decimal number (got '010')"
    )


# --- exact errors ----------------------------------------------------------------------


def test_missing_name() -> None:
    assert (
        dropin_error("rules:\n  - decision: allow\n")
        == f"{D}:2:5: rules[0]: missing name (every rule needs a unique name)"
    )


def test_missing_decision() -> None:
    assert dropin_error("rules:\n  - name: x\n") == f"{D}:2:5: rules[0] (x): missing decision (allow, ask or deny)"


def test_bad_decision() -> None:
    text = "rules:\n  - name: a\n    decision: allow\n  - name: b\n    decision: yes\n"
    assert dropin_error(text) == f"{D}:5:15: rules[1] (b).decision: must be one of allow, ask, deny (got 'yes')"


def test_rules_not_a_list() -> None:
    assert dropin_error("rules:\n  name: x\n") == f"{D}:2:3: rules: expected a list of rules (got a mapping)"


def test_commands_not_a_list_and_command_written_as_a_string() -> None:
    assert dropin_error("rules:\n- {name: x, decision: allow, commands: /usr/bin/ls}\n") == (
        f"{D}:2:40: rules[0] (x).commands: expected a list of commands, each a list like [/usr/bin/apt-get, update] "
        "(got '/usr/bin/ls')"
    )
    text = "rules:\n  - name: x\n    decision: allow\n    commands:\n      - /usr/bin/apt-get update\n"
    assert dropin_error(text) == (
        f"{D}:5:9: rules[0] (x).commands[0]: expected a command as a list of strings, like [/usr/bin/apt-get, update]"
        " (got '/usr/bin/apt-get update')"
    )


def test_non_absolute_head() -> None:
    text = (
        "rules:\n  - name: apt-refresh\n    decision: allow\n    commands:\n"
        "      - [/usr/bin/apt-get, update]\n      - [apt-get, install]\n"
    )
    assert dropin_error(text) == (
        f"{D}:6:10: rules[0] (apt-refresh).commands[1][0]: the first element must be an absolute path (got 'apt-get')"
    )


def test_empty_command_and_empty_lists() -> None:
    assert (
        dropin_error("rules:\n- {name: x, decision: allow, commands: [[]]}\n")
        == f"{D}:2:41: rules[0] (x).commands[0]: empty command"
    )
    assert dropin_error("rules:\n- {name: x, decision: allow, users: []}\n") == (
        f"{D}:2:37: rules[0] (x).users: must not be empty (leave users out to mean any) (got a list)"
    )


def test_rest_not_last() -> None:
    text = 'rules:\n  - name: x\n    decision: allow\n    commands: [[/usr/bin/journalctl, "...", -u, nginx]]\n'
    assert (
        dropin_error(text)
        == f"{D}:4:38: rules[0] (x).commands[0][1]: \"...\" is only allowed as the last element (got '...')"
    )


def test_bad_placeholder_name() -> None:
    text = 'rules:\n  - name: x\n    decision: allow\n    commands: [[/usr/bin/apt-get, install, "{pkg name}"]]\n'
    assert dropin_error(text) == (
        f"{D}:4:44: rules[0] (x).commands[0][2]: bad placeholder name: use {{name}} with letters, digits and _"
        " (not starting with a digit) (got '{pkg name}')"
    )


def test_non_string_elements() -> None:
    text = "rules:\n  - name: x\n    decision: allow\n    commands: [[/usr/bin/chmod, 0755, /srv/x]]\n"
    assert (
        dropin_error(text)
        == f"{D}:4:33: rules[0] (x).commands[0][1]: expected a string (quote numbers and booleans) (got '0755')"
    )
    text = "rules:\n  - name: x\n    decision: allow\n    commands: [[/usr/bin/x, [a]]]\n"
    assert (
        dropin_error(text)
        == f"{D}:4:29: rules[0] (x).commands[0][1]: expected a string (quote numbers and booleans) (got a list)"
    )


def test_unknown_rule_key() -> None:
    text = "rules:\n  - name: x\n    decision: allow\n    command: [[/usr/bin/true]]\n"
    assert dropin_error(text) == (
        f"{D}:4:5: rules[0] (x).command: unknown key"
        " (known: approvals, approvers, commands, credentials, cwd, decision, description, files, groups, mode, "
        "name, privileged, reason, reviewer, run_as, sandbox,"
        " sessions, stdin, users, writable_arguments)"
    )


def test_policy_d_holds_rules_only() -> None:
    assert dropin_error("default: allow\nrules: []\n") == (
        f"{D}:1:1: default: not allowed here: a policy.d file holds rules: only (default belongs under policy: in "
        "airlock.yaml)"
    )
    assert dropin_error("rules: []\nextra: 1\n") == f"{D}:2:1: extra: unknown key (a policy.d file holds rules: only)"
    assert (
        dropin_error("- {name: x, decision: allow}\n")
        == f"{D}:1:1: (top level): a policy.d file is a mapping holding rules: only (got a list)"
    )


def test_bad_privileged_and_groups() -> None:
    assert dropin_error("rules: [{name: x, decision: allow, privileged: maybe}]") == (
        f"{D}:1:48: rules[0] (x).privileged: expected true or false (leave it out to mean either) (got 'maybe')"
    )
    assert dropin_error("rules: [{name: x, decision: allow, groups: [1000]}]") == (
        f"{D}:1:45: rules[0] (x).groups[0]: expected a name (got '1000')"
    )


def test_reserved_and_odd_names() -> None:
    assert dropin_error("rules: [{name: default, decision: allow}]") == (
        f"{D}:1:16: rules[0].name: 'default' is reserved for decisions no rule made (got 'default')"
    )
    assert dropin_error("rules: [{name: a b, decision: allow}]") == (
        f"{D}:1:16: rules[0].name: a rule name is 1 to 128 characters without spaces (got 'a b')"
    )
    assert (
        dropin_error("rules: [{name: 12, decision: allow}]")
        == f"{D}:1:16: rules[0].name: expected a rule name (got '12')"
    )


def test_non_string_keys() -> None:
    assert (
        dropin_error("1: x\n")
        == f"{D}:1:1: (top level): keys must be strings (YAML merge keys are not supported) (got '1')"
    )


def test_invalid_yaml() -> None:
    assert dropin_error("rules: [\n") == f"{D}:2:1: not valid YAML: expected the node content, but found '<stream end>'"


def test_every_bad_rule_is_reported_and_the_policy_rejected_whole() -> None:
    text = (
        "rules:\n  - {name: ok, decision: allow}\n  - {name: a, decision: nope}\n  - {name: b, decision: allow, x: 1}\n"
    )
    with pytest.raises(PolicyError) as info:
        parse_policy_text(text, D, main=False)
    assert info.value.errors == (
        f"{D}:3:25: rules[1] (a).decision: must be one of allow, ask, deny (got 'nope')",
        f"{D}:4:32: rules[2] (b).x: unknown key (known: approvals, approvers, commands, credentials, cwd, "
        "decision, description, files, groups, mode, name, privileged, reason, "
        "reviewer, run_as, sandbox, sessions, stdin, users, writable_arguments)",
    )


def test_duplicate_names_across_files_name_both_places(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load(
            tmp_path,
            "policy:\n  rules:\n    - name: apt\n      decision: allow\n",
            {"10-x.yaml": "rules:\n  - name: other\n    decision: ask\n  - name: apt\n    decision: deny\n"},
        )
    assert str(info.value) == (
        f"{tmp_path}/policy.d/10-x.yaml:4:11: rules[1] (apt).name: duplicate rule name,"
        f" first defined at {tmp_path}/airlock.yaml:5 (got 'apt')"
    )


def test_errors_from_all_files_are_collected(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load(
            tmp_path,
            "policy:\n  default: sometimes\n",
            {"10-a.yaml": "rules: 5\n", "20-b.yaml": "rules:\n  - {decision: allow}\n"},
        )
    assert info.value.errors == (
        f"{tmp_path}/airlock.yaml:4:12: policy.default: must be one of allow, ask, deny (got 'sometimes')",
        f"{tmp_path}/policy.d/10-a.yaml:1:8: rules: expected a list of rules (got '5')",
        f"{tmp_path}/policy.d/20-b.yaml:2:5: rules[0]: missing name (every rule needs a unique name)",
    )


def test_main_file_errors() -> None:
    main = "/etc/airlock/airlock.yaml"
    with pytest.raises(PolicyError) as info:
        parse_policy_text("policy:\n  default: ask\n  rule: []\n", main, main=True)
    assert str(info.value) == f"{main}:3:3: policy.rule: unknown key (known: default, rules)"
    with pytest.raises(PolicyError) as info:
        parse_policy_text("log: {level: info}\ndefault: deny\n", main, main=True)
    assert str(info.value) == f"{main}:2:1: default: belongs under policy: in airlock.yaml"
    with pytest.raises(PolicyError) as info:
        parse_policy_text("policy:\n  rules:\n    - {name: x, decision: allow, users: deploy}\n", main, main=True)
    assert (
        str(info.value)
        == f"{main}:3:41: policy.rules[0] (x).users: expected a list of user names or uids (got 'deploy')"
    )


def test_files_section_errors() -> None:
    def bad(files: str) -> str:
        return dropin_error(f"rules:\n- name: f\n  decision: allow\n  files: {files}\n")

    assert (
        bad("[{tools: [files_read], paths: [etc/x]}]")
        == f"{D}:4:41: rules[0] (f).files[0].paths[0]: must be an absolute path (got 'etc/x')"
    )
    assert bad("[{tools: [files_read], paths: ['/var/log/*.log']}]") == (
        f"{D}:4:41: rules[0] (f).files[0].paths[0]: no globs: name a file, or a subtree with a trailing /... (got "
        "'/var/log/*.log')"
    )
    assert bad("[{tools: [files_read], paths: [/a/.../b]}]") == (
        f"{D}:4:41: rules[0] (f).files[0].paths[0]: \"...\" is only allowed as the last path segment (got '/a/.../b')"
    )
    assert bad("[{tools: [files_read], paths: [/a/../b]}]") == (
        f"{D}:4:41: rules[0] (f).files[0].paths[0]: must be a normalised path (no empty, . or .. segments, no "
        "trailing /) (got '/a/../b')"
    )
    assert bad("[{tools: [rm], paths: [/a]}]").startswith(
        f"{D}:4:20: rules[0] (f).files[0].tools[0]: unknown tool (known: files_edit,"
    )
    assert bad("[{tools: [files_read]}]") == f"{D}:4:11: rules[0] (f).files[0]: missing paths"


def test_files_section_is_stored_canonically() -> None:
    f = parse_policy_text(
        "rules:\n- {name: f, decision: allow, files: [{tools: [files_read], paths: [/bin/..., /..., /etc/hosts]}]}",
        D,
        main=False,
    )
    (grant,) = f.rules[0].files or ()
    assert grant.tools == frozenset({"files_read"})
    assert grant.paths == ("/usr/bin/...", "/...", "/etc/hosts")


def test_a_bare_policy_document_is_a_main_policy_too() -> None:
    f = parse_policy_text("default: deny\nrules: [{name: x, decision: allow}]\n", "/p.yaml", main=True)
    assert (f.default, [r.name for r in f.rules]) == ("deny", ["x"])
    with pytest.raises(PolicyError) as info:
        parse_policy_text("default: deny\nrules: [{name: x, decision: allow, y: 1}]\n", "/p.yaml", main=True)
    assert str(info.value).startswith("/p.yaml:2:36: rules[0] (x).y: unknown key")
    assert parse_policy_text("log: {level: info}\n", "/p.yaml", main=True).rules == ()


def test_assemble_refuses_two_defaults() -> None:
    a = parse_policy_text("policy: {default: allow}", "/a.yaml", main=True)
    b = parse_policy_text("policy: {default: deny}", "/b.yaml", main=True)
    with pytest.raises(PolicyError, match=r"^/b.yaml: policy.default: set more than once \(also in /a.yaml\)$"):
        assemble([a, b])


# --- shipped examples ------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[3]


def test_the_example_policy_d_file_loads() -> None:
    path = REPO / "config/policy.d/50-examples.yaml.example"
    f = parse_policy_text(path.read_text(), str(path), main=False)
    assert "no-disk-tools" in {r.name for r in f.rules}


def test_the_worked_example_in_docs_loads() -> None:
    text = (REPO / "docs/policy.md").read_text().split("## Worked examples")[1].split("```yaml\n")[1].split("```")[0]
    policy = assemble([parse_policy_text(text, "docs/policy.md", main=True)])
    assert {r.name for r in policy.rules} == {"read-only-status", "apt-install", "no-disk-tools"}


def test_the_engine_is_pure() -> None:
    # No sockets, event loops or subprocesses: the service moves bytes, the engine decides.
    import ast

    for name in ("rules.py", "policyfile.py", "policy.py", "match.py"):
        tree = ast.parse((REPO / "services/airlock/approval" / name).read_text())
        imported = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"socket", "asyncio", "subprocess", "threading", "selectors"}, name


def test_cwd_stdin_and_file_placeholders_load_and_their_mistakes_are_named() -> None:
    good = (
        "rules:\n  - name: a\n    decision: allow\n    cwd: /srv/app\n    stdin: sha256:"
        + "0" * 64
        + '\n    commands: [[/usr/bin/cat, "{f:file}", "/srv/app/logs/{g:file}"]]\n'
    )
    (rule,) = parse_policy_text(good, D, main=False).rules
    assert (rule.cwd, rule.stdin) == ("/srv/app", "sha256:" + "0" * 64)
    assert rule.commands == (("/usr/bin/cat", "{f:file}", "/srv/app/logs/{g:file}"),)
    cases = [
        ("    cwd: srv\n", "4:10: rules[0] (a).cwd: must be none or an absolute, normalised directory"),
        ("    cwd: /srv/../etc\n", "4:10: rules[0] (a).cwd: must be none or an absolute, normalised directory"),
        ("    stdin: sha256:xyz\n", "4:12: rules[0] (a).stdin: must be none or sha256: and 64 lowercase hex digits"),
        ('    commands: [[/usr/bin/cat, "{f:dir}"]]\n', "4:31: rules[0] (a).commands[0][1]: unknown placeholder type"),
        (
            '    commands: [[/usr/bin/cat, "logs/{f:file}"]]\n',
            "4:31: rules[0] (a).commands[0][1]: the directory before {name:file} must be an absolute, normalised path",
        ),
    ]
    for line, message in cases:
        text = "rules:\n  - name: a\n    decision: allow\n" + line
        assert dropin_error(text).startswith(f"{D}:{message}"), (line, dropin_error(text))


def test_credentials_load_only_on_a_rule_for_root_jobs(tmp_path: Path) -> None:
    """Issue 51: an unprivileged job runs as the agent, who could read systemd's copy of the value."""
    import os

    from airlock.approval.rules import Rule

    secret = tmp_path / "db.pass"
    secret.write_text("credential-value\n")
    os.chmod(secret, 0o600)
    text = "rules:\n  - name: r\n    decision: allow\n{privileged}    credentials: {{db: {path}}}\n"
    # Control: a rule for root jobs only loads.
    parse_policy_text(text.format(privileged="    privileged: true\n", path=secret), "/p.yaml", main=False)
    for privileged, line in (("", 4), ("    privileged: false\n", 5)):
        with pytest.raises(PolicyError) as info:
            parse_policy_text(text.format(privileged=privileged, path=secret), "/p.yaml", main=False)
        assert str(info.value) == (
            f"/p.yaml:{line}:18: rules[0] (r).credentials: apply only to a rule with privileged: true"
            " (an unprivileged job runs as the agent, who could then read the value)"
        )
    # Rules built in code get the same guarantee.
    with pytest.raises(ValueError, match="privileged: true"):
        Rule("r", "allow", frozenset(), frozenset(), frozenset(), None, None, "x", credentials={"db": str(secret)})
