"""The one typed configuration object, built once at start-up.

Every setting is one row of `SETTINGS` (key, parser, default, help): the row
drives file parsing, `airlock config show` and the docs.  YAML is composed
with the safe loader so every node keeps its line and column, and every error
renders as ``path:line:col: key.path: message (got 'value')``.  Parsers raise
`ConfigError`; only a ``main()`` exits.

The ``policy:`` section is not parsed here: the policy engine reads its node
(and policy.d/) itself, so its errors can name rules and lines too.

The pieces: `configvalues` (the value parsers and their errors), `configsections`
(one dataclass per section), `settings_access` and `settings_services` (the
settings table's rows).  Every name they define that a caller used from this
module is re-exported here, so ``from airlock.common.config import ...`` keeps
working.
"""

from __future__ import annotations

import dataclasses
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from airlock.common import channels, settings_access, settings_services
from airlock.common.channels.base import Channel
from airlock.common.configsections import (
    Agents,
    Approval,
    Env,
    Journal,
    Limits,
    Log,
    Notify,
    Paths,
    Principals,
    Runner,
    Services,
    Web,
)
from airlock.common.configvalues import (
    REQUIRED,
    WEB_PORT,
    ConfigError,
    NodeError,
    Observers,
    Parser,
    Setting,
    SignerAccounts,
    absolute_path,
    choice,
    command,
    env_patterns,
    fail_at,
    label,
    non_negative_float,
    non_negative_int,
    observers,
    optional_absolute_path,
    optional_string,
    parse_bool,
    positive_float,
    positive_int,
    signer_accounts,
    string,
    string_list,
    url,
    web_listen,
    web_url,
)
from airlock.common.peer import identify, may_decide
from airlock.common.settings_access import MAX_TOTAL_OUTPUT, RELAYED_APPROVAL_TIMEOUT, RELAYED_WHY, MiB
from airlock.common.yamlnodes import STR, compose, is_null, syntax_error

DEFAULT_CONFIG_PATH = Path("/etc/airlock/airlock.yaml")

# What callers import from here (the pieces live in the modules above).
__all__ = [
    "DEFAULT_CONFIG_PATH",
    "MAX_TOTAL_OUTPUT",
    "RELAYED_APPROVAL_TIMEOUT",
    "REQUIRED",
    "SETTINGS",
    "WEB_PORT",
    "Agents",
    "Approval",
    "Config",
    "ConfigError",
    "Env",
    "Journal",
    "Limits",
    "Log",
    "MiB",
    "NodeError",
    "Notify",
    "Observers",
    "Parser",
    "Paths",
    "Principals",
    "Runner",
    "Services",
    "Setting",
    "SignerAccounts",
    "Web",
    "absolute_path",
    "applies",
    "choice",
    "command",
    "defaults",
    "env_patterns",
    "label",
    "load",
    "non_negative_float",
    "non_negative_int",
    "observers",
    "optional_absolute_path",
    "optional_string",
    "parse_bool",
    "parse_text",
    "positive_float",
    "positive_int",
    "signer_accounts",
    "string",
    "string_list",
    "url",
    "web_listen",
    "web_url",
]


@dataclass(frozen=True, slots=True)
class Config:
    paths: Paths
    agents: Agents
    operators: Principals
    services: Services
    limits: Limits
    env: Env
    approval: Approval
    journal: Journal
    runner: Runner
    log: Log
    notify: Notify
    web: Web = Web()  # noqa: RUF009 (frozen: one shared default is safe)
    # Where the config came from, and the raw ``policy:`` node for the policy engine.
    source: str = "<built-in>"
    policy_node: yaml.Node | None = dataclasses.field(default=None, compare=False, repr=False)
    # Issue 44: set when the file on disk was refused and this is the last accepted copy or the defaults.
    refused: str = dataclasses.field(default="", compare=False)
    # Settings whose value another setting chose, each with why (issue 44: said, never silent).
    derived: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for setting in SETTINGS:
            section, name = setting.key.split(".", 1)
            value = getattr(getattr(self, section), name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, (Observers, SignerAccounts)):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = [_public(v) for v in value]
            out.setdefault(section, {})[name] = value
        return out

    def socket_path(self, name: str) -> Path:
        """Where a named socket lives: agent/operator at the top, others in internal/."""
        if name in ("agent", "operator"):
            return self.paths.runtime_dir / f"{name}.sock"
        return self.paths.runtime_dir / "internal" / f"{name}.sock"


_SECTIONS: dict[str, type] = {
    "paths": Paths,
    "agents": Agents,
    "operators": Principals,
    "services": Services,
    "limits": Limits,
    "env": Env,
    "approval": Approval,
    "journal": Journal,
    "runner": Runner,
    "log": Log,
    "notify": Notify,
    "web": Web,
}


def _public(value: Any) -> Any:
    """A list item for to_dict(): a channel's entry with its secrets masked, everything else as is."""
    return channels.public(value) if isinstance(value, Channel) else value


SETTINGS: tuple[Setting, ...] = settings_access.ROWS + settings_services.ROWS
_BY_KEY = {s.key: s for s in SETTINGS}


def applies(key: str) -> str:
    """When a changed setting takes effect: ``reload`` or ``restart`` (docs/configuration.md).

    ``systemctl reload airlock-approval`` (SIGHUP) re-reads the file and applies
    the policy and every ``approval.*`` setting to new requests; every other
    setting is read once at start, so its service must be restarted.
    """
    if key.startswith("approval.reviewer_"):
        return "restart"  # the runner starts the reviewer with what it read at its own start (issue 34)
    return "reload" if key.startswith("approval.") else "restart"


def _build(values: dict[str, Any], source: str, policy_node: yaml.Node | None) -> Config:
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        fields = {f.name: values[f"{name}.{f.name}"] for f in dataclasses.fields(cls)}
        sections[name] = cls(**fields)
    return Config(**sections, source=source, policy_node=policy_node)


def defaults() -> Config:
    return _build({s.key: s.default for s in SETTINGS}, "<built-in>", None)


def _mapping_items(node: yaml.MappingNode, path: str, prefix: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    items: list[tuple[str, yaml.Node, yaml.Node]] = []
    seen: set[str] = set()
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != STR:
            raise fail_at(path, key_node, prefix or "(top level)", "keys must be strings")
        key = str(key_node.value)
        full = f"{prefix}.{key}" if prefix else key
        if key in seen:
            raise fail_at(path, key_node, full, "duplicate key")
        seen.add(key)
        items.append((key, key_node, value_node))
    return items


def parse_text(text: str, path: str, base: Config | None = None) -> Config:
    """Parse a config file's text over ``base`` (the built-in defaults)."""
    base = base or defaults()
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        section, name = setting.key.split(".", 1)
        values[setting.key] = getattr(getattr(base, section), name)
    given: set[str] = set()
    policy_node = base.policy_node
    try:
        root = compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(syntax_error(path, exc)) from None
    if root is None or is_null(root):
        return _build(values, path, policy_node)
    if not isinstance(root, yaml.MappingNode):
        raise fail_at(path, root, "(top level)", "the file must be a mapping of sections")
    for section, key_node, section_node in _mapping_items(root, path, ""):
        if section == "policy":
            policy_node = section_node
            continue
        if section not in _SECTIONS:
            raise fail_at(
                path, key_node, section, f"unknown section (known: {', '.join(sorted([*_SECTIONS, 'policy']))})"
            )
        if is_null(section_node):
            continue
        if not isinstance(section_node, yaml.MappingNode):
            raise fail_at(path, section_node, section, "expected a mapping")
        for name, name_node, value_node in _mapping_items(section_node, path, section):
            key = f"{section}.{name}"
            found = _BY_KEY.get(key)
            if found is None:
                known = sorted(s.key.split(".", 1)[1] for s in SETTINGS if s.key.startswith(section + "."))
                raise fail_at(path, name_node, key, f"unknown key (known in {section}: {', '.join(known)})")
            try:
                values[key] = found.parse(value_node)
            except NodeError as exc:
                raise fail_at(path, exc.node, f"{key}{exc.key}", str(exc)) from None
            except ValueError as exc:
                raise fail_at(path, value_node, key, str(exc)) from None
            given.add(key)
    derived = tuple(d for d in base.derived if d[0] not in given)
    if values["notify.channels"] and "approval.timeout_seconds" not in given and base == defaults():
        values["approval.timeout_seconds"] = RELAYED_APPROVAL_TIMEOUT
        derived = (("approval.timeout_seconds", RELAYED_WHY),)
    config = dataclasses.replace(_build(values, path, policy_node), derived=derived)
    _check(config, path)
    return config


def _check(config: Config, path: str) -> None:
    _check_signer_accounts(config, path)
    _check_output_log(config, path)
    _check_fleet_groups(config, path)
    limits = config.limits
    if limits.replay_window_seconds < 2 * limits.freshness_seconds:
        raise ConfigError(
            f"{path}: limits.replay_window_seconds: must be at least twice limits.freshness_seconds "
            f"(got {limits.replay_window_seconds:g} with freshness {limits.freshness_seconds:g})"
        )
    if limits.clock_skew_seconds >= limits.replay_window_seconds - limits.freshness_seconds:
        raise ConfigError(f"{path}: limits.clock_skew_seconds: must be smaller than the replay window minus freshness")
    if limits.max_total_output_bytes > MAX_TOTAL_OUTPUT:
        # The runner's reply carries the output base64-encoded and must fit what intake reads (common/ipc.py).
        raise ConfigError(
            f"{path}: limits.max_total_output_bytes: must be at most {MAX_TOTAL_OUTPUT} "
            f"(got {limits.max_total_output_bytes})"
        )


def _check_fleet_groups(config: Config, path: str) -> None:
    """A host group names only hosts the console knows (a typo would filter a host out, silently)."""
    known = set(config.web.fleet_hosts)
    for name, hosts in config.web.fleet_groups:
        unknown = [h for h in hosts if h not in known]
        if unknown:
            raise ConfigError(
                f"{path}: web.fleet_groups.{name}: {', '.join(map(repr, unknown))} not in web.fleet_hosts"
            )


def _check_output_log(config: Config, path: str) -> None:
    if config.runner.output_log_max_bytes > MAX_TOTAL_OUTPUT:
        # `airlock show --output` carries a whole log base64-encoded in one reply (common/ipc.py).
        raise ConfigError(
            f"{path}: runner.output_log_max_bytes: must be at most {MAX_TOTAL_OUTPUT} "
            f"(got {config.runner.output_log_max_bytes})"
        )


def _check_signer_accounts(config: Config, path: str) -> None:
    """Every mapped account must be a full operator (one who may approve by uid), not an observer."""
    mapped = config.approval.signer_accounts
    ops = config.operators
    for (principal, account), node in zip(mapped.pairs, mapped.nodes, strict=False):
        entry = pwd.getpwuid(int(account)) if account.isdigit() else pwd.getpwnam(account)
        peer = identify(0, entry.pw_uid, entry.pw_gid)
        if not may_decide(peer, ops.users, ops.groups, ops.observers.users):
            raise fail_at(
                path,
                node,
                f"approval.signer_accounts.{principal}",
                f"{account!r} is not an operator (operators.users, operators.groups): every approver is an "
                "operator account",
            )


def load(path: Path | None = None, *, base: Config | None = None, missing_ok: bool = True) -> Config:
    """Load the config file (default /etc/airlock/airlock.yaml) over the built-in defaults."""
    target = path or DEFAULT_CONFIG_PATH
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        if path is None and missing_ok:
            return base or defaults()
        raise ConfigError(f"{target}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{target}: cannot read: {exc}") from None
    return parse_text(text, str(target), base)
