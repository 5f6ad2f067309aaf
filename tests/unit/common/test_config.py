"""Configuration: defaults, exact error messages, and the settings table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airlock.common import config


def test_an_empty_file_gives_the_built_in_defaults() -> None:
    assert config.parse_text("", "/etc/airlock/airlock.yaml").to_dict() == config.defaults().to_dict()


def test_a_missing_default_file_is_the_defaults_but_a_named_one_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="no such file"):
        config.load(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "limits:\n  max_request_bytes: -3\n",
            "/x.yaml:2:22: limits.max_request_bytes: must be a positive integer (got '-3')",
        ),
        (
            "limits:\n  max_request_bytes: lots\n",
            "/x.yaml:2:22: limits.max_request_bytes: expected an integer (got 'lots')",
        ),
        (
            "limitz: {}\n",
            "/x.yaml:1:1: limitz: unknown section (known: agents, approval, env, journal, limits, log, notify, "
            "operators, paths, policy, runner, services, web) (got 'limitz')",
        ),
        (
            "agents:\n  userz: []\n",
            "/x.yaml:2:3: agents.userz: unknown key (known in agents: groups, require_token, retry_window_seconds, "
            "users) (got 'userz')",
        ),
        (
            "agents:\n  require_token: maybe\n",
            "/x.yaml:2:18: agents.require_token: expected true or false (got 'maybe')",
        ),
        ("agents:\n  users: bob\n", "/x.yaml:2:10: agents.users: expected a list of strings (got 'bob')"),
        ("paths:\n  state_dir: var/lib\n", "/x.yaml:2:14: paths.state_dir: must be an absolute path (got 'var/lib')"),
        (
            "runner:\n  containment: jail\n",
            "/x.yaml:2:16: runner.containment: must be one of auto, service, scope, process-group (got 'jail')",
        ),
        (
            "env:\n  allow: [GOOD, 'BAD-NAME']\n",
            "/x.yaml:2:10: env.allow: 'BAD-NAME' is not a variable name (a trailing * is allowed) (got a list)",
        ),
        (
            "env:\n  allow: [LANG, LC_*,\n    APT_*]\n",
            "/x.yaml:3:5: env.allow[2]: 'APT_*' admits names a privileged job may never set (APT_*); "
            "list the exact names you need instead (got 'APT_*')",
        ),
        (
            "env:\n  allow: [P*]\n",
            "/x.yaml:2:11: env.allow[0]: 'P*' admits names a privileged job may never set (PAGER, PATH, "
            "PATH_LOCALE, PHPRC, ...); list the exact names you need instead (got 'P*')",
        ),
        ("limits: [1]\n", "/x.yaml:1:9: limits: expected a mapping (got a list)"),
        (
            "limits:\n  freshness_seconds: 1\n  freshness_seconds: 2\n",
            "/x.yaml:3:3: limits.freshness_seconds: duplicate key (got 'freshness_seconds')",
        ),
        ("a: [\n", "/x.yaml:2:1: not valid YAML: expected the node content, but found '<stream end>'"),
    ],
)
def test_errors_name_file_line_column_and_key(text: str, message: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.parse_text(text, "/x.yaml")
    assert str(err.value) == message


def test_cross_checks_between_settings() -> None:
    with pytest.raises(config.ConfigError, match="replay_window_seconds: must be at least twice"):
        config.parse_text("limits:\n  freshness_seconds: 200\n", "/x.yaml")


def test_values_are_typed_and_the_policy_node_is_kept_for_the_engine() -> None:
    cfg = config.parse_text(
        "limits:\n  max_connections: 8\nagents:\n  groups: [airlock]\npolicy:\n  default: deny\n", "/x.yaml"
    )
    assert cfg.limits.max_connections == 8
    # The per-agent cap's default is derived from max_connections when read.
    assert cfg.limits.max_connections_per_agent == 0 and cfg.limits.connections_per_agent == 2
    assert config.defaults().limits.connections_per_agent == 16
    assert cfg.agents.groups == ("airlock",)
    assert cfg.policy_node is not None and cfg.policy_node.start_mark.line == 5


def test_every_setting_has_a_default_help_and_a_field() -> None:
    keys = {s.key for s in config.SETTINGS}
    assert set(config.defaults().to_dict()) == {k.split(".")[0] for k in keys}
    assert all(s.help for s in config.SETTINGS)


def _yaml_flow(value: object) -> str:
    """A default as it is written in airlock.yaml's flow style."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_yaml_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_flow(v)}" for k, v in value.items()) + "}"
    to_dict = getattr(value, "to_dict", None)
    return _yaml_flow(to_dict()) if callable(to_dict) else str(value)


def settings_table() -> str:
    """docs/configuration.md's table of settings, made from the settings table (key, default, applies, help)."""
    rows = ["| key | default | applies | meaning |", "|---|---|---|---|"]
    for s in config.SETTINGS:
        meaning = s.help.replace("|", "\\|")
        rows.append(f"| `{s.key}` | `{_yaml_flow(s.default)}` | {config.applies(s.key)} | {meaning} |")
    return "\n".join(rows) + "\n"


def test_the_configuration_doc_has_the_settings_table() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    table = settings_table()
    assert table in doc, "docs/configuration.md's settings table must read, exactly:\n" + table


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "operators: {observers: {users: bob}}\n",
            "/x.yaml:1:32: operators.observers.users: expected a list of strings (got 'bob')",
        ),
        (
            "operators: {observers: {people: [bob]}}\n",
            "/x.yaml:1:25: operators.observers.people: unknown key (known: users, groups) (got 'people')",
        ),
        (
            "notify:\n  channels:\n    - {type: pigeon}\n",
            "/x.yaml:3:14: notify.channels[0].type: must be one of email, fleet, ntfy, slack, webhook (got 'pigeon')",
        ),
        (
            "notify:\n  channels:\n    - {type: slack}\n",
            "/x.yaml:3:7: notify.channels[0].url: a slack channel needs url (got a mapping)",
        ),
        (
            "notify:\n  channels:\n    - {type: webhook, url: 'ftp://h/', secret: 0123456789abcdef}\n",
            "/x.yaml:3:28: notify.channels[0].url: must be an http:// or https:// URL (got 'ftp://h/')",
        ),
        (
            "notify:\n  channels:\n    - {type: webhook, url: 'http://h/', secret: short}\n",
            "/x.yaml:3:49: notify.channels[0].secret: must be at least 16 characters (got 'short')",
        ),
        (
            "notify:\n  channels:\n    - {type: email, from: a@h, to: [b@h], port: 70000}\n",
            "/x.yaml:3:49: notify.channels[0].port: must be a TCP port (1-65535) (got '70000')",
        ),
        (
            "notify:\n  channels:\n    - {type: slack, url: 'http://h/', name: a}\n    - "
            "{type: slack, url: 'http://h/', name: a}\n",
            "/x.yaml:4:45: notify.channels[1].name: channel names must be unique (got 'a')",
        ),
    ],
)
def test_nested_errors_point_at_the_inner_value(text: str, message: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.parse_text(text, "/x.yaml")
    assert str(err.value) == message


def test_channels_and_observers_parse_and_secrets_stay_out_of_show() -> None:
    cfg = config.parse_text(
        "operators: {observers: {users: [airlock-notify]}}\n"
        "notify:\n  channels:\n"
        "    - {type: webhook, url: 'https://h/hook', secret: 0123456789abcdef}\n"
        "    - {type: email, from: airlock@h, to: [ops@h], starttls: true, username: u, password: pw}\n",
        "/x.yaml",
    )
    assert cfg.operators.observers.users == ("airlock-notify",)
    webhook, email = cfg.notify.channels
    assert webhook["name"] == "webhook-0" and webhook["secret"] == "0123456789abcdef"
    assert email["port"] == 25 and email["starttls"] is True and email["to"] == ("ops@h",)
    shown = cfg.to_dict()
    assert shown["operators"]["observers"] == {"users": ["airlock-notify"], "groups": []}
    assert shown["notify"]["channels"][0]["secret"] == "[set]"
    assert shown["notify"]["channels"][1]["password"] == "[set]"
    assert "0123456789abcdef" not in repr(shown)


def test_the_reaching_operators_examples_parse() -> None:
    """Every YAML example under "Reaching operators" in docs/operations.md is a valid configuration."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()
    section = doc[doc.index("### Reaching operators") : doc.index("### Hearing about pending work")]
    blocks = section.split("```yaml\n")[1:]
    assert len(blocks) >= 4
    types = set()
    for block in blocks:
        cfg = config.parse_text(block.split("```", 1)[0], "operations.md")
        types |= {c["type"] for c in cfg.notify.channels}
    assert types == {"ntfy", "slack", "email", "webhook"}


@pytest.mark.parametrize("pattern", ["LC_*", "DEBIAN_*", "LD_PRELOAD", "PYTHONPATH"])
def test_env_allow_takes_wildcards_that_admit_no_denied_name_and_exact_names(pattern: str) -> None:
    # An exact name stays the operator's choice: it serves unprivileged jobs, a root job is refused it per request.
    assert pattern in config.parse_text(f"env:\n  allow: [{pattern}]\n", "/x.yaml").env.allow


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            "{a@x: nosuchuser-al}",
            "/x.yaml:3:26: approval.signer_accounts.a@x: unknown account 'nosuchuser-al' (no such user)",
        ),
        (
            "{a@x: root, a@x: 0}",
            "/x.yaml:3:32: approval.signer_accounts.a@x: duplicate mapping: a principal is one person",
        ),
        ("{a@x: daemon}", "/x.yaml:3:26: approval.signer_accounts.a@x: 'daemon' is not an operator"),
        ("[root]", "/x.yaml:3:20: approval.signer_accounts: expected a mapping of allowed_signers principal"),
    ],
)
def test_signer_accounts_are_checked_at_load(mapping: str, message: str) -> None:
    text = f"operators: {{users: [], groups: []}}\napproval:\n  signer_accounts: {mapping}\n"
    with pytest.raises(config.ConfigError) as info:
        config.parse_text(text, "/x.yaml")
    assert message in str(info.value)


def test_signer_accounts_map_principals_to_operator_accounts() -> None:
    text = "operators: {users: [daemon]}\napproval:\n  signer_accounts: {a@x: daemon, a-laptop: daemon, r@x: 0}\n"
    mapped = config.parse_text(text, "/x.yaml").approval.signer_accounts
    assert mapped.account("a@x") == "daemon" and mapped.account("a-laptop") == "daemon" and mapped.account("r@x") == "0"
    assert mapped.account("b@x") is None
    assert config.parse_text(text, "/x.yaml").to_dict()["approval"]["signer_accounts"] == {
        "a@x": "daemon",
        "a-laptop": "daemon",
        "r@x": "0",
    }


CHANNEL = (
    "notify:\n  channels:\n    - {type: webhook, name: hook, url: 'http://127.0.0.1:9/x', secret: 0123456789abcdef0}\n"
)


def test_the_relayed_approval_wait_is_said_where_settings_are_shown(tmp_path: Path) -> None:
    """Issue 44: once notify.channels is set, approval's wait silently became 600 s; now the
    configuration says which setting chose it, and `airlock config show` prints it."""
    cfg = config.parse_text(CHANNEL, "/x.yaml")
    assert cfg.approval.timeout_seconds == config.RELAYED_APPROVAL_TIMEOUT
    assert [key for key, _ in cfg.derived] == ["approval.timeout_seconds"]
    given = config.parse_text(CHANNEL + "approval: {timeout_seconds: 90}\n", "/x.yaml")
    assert (given.approval.timeout_seconds, given.derived) == (90, ())
    assert config.parse_text("", "/x.yaml").derived == ()
    path = tmp_path / "airlock.yaml"
    path.write_text(CHANNEL)
    shown = subprocess.run(
        [sys.executable, "-m", "airlock", "config", "show", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert (
        "# approval.timeout_seconds is 600.0 because notify.channels is set and approval.timeout_seconds is not"
        in shown.stdout
    ), shown.stdout
