"""The one typed configuration object, built once at start-up.

Every setting is one row of `SETTINGS` (key, parser, default, help): the row
drives file parsing, `airlock config show` and the docs.  YAML is composed
with the safe loader so every node keeps its line and column, and every error
renders as ``path:line:col: key.path: message (got 'value')``.  Parsers raise
`ConfigError`; only a ``main()`` exits.

The ``policy:`` section is not parsed here: the policy engine reads its node
(and policy.d/) itself, so its errors can name rules and lines too.
"""

from __future__ import annotations

import dataclasses
import pwd
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from airlock.common import containment, envrule
from airlock.common.peer import identify, may_decide
from airlock.common.yamlnodes import BOOL, FLOAT, INT, STR, got, is_null, syntax_error, where

DEFAULT_CONFIG_PATH = Path("/etc/airlock/airlock.yaml")


class ConfigError(Exception):
    """A configuration problem, already rendered for a human."""


def _fail(path: str, node: yaml.Node | None, key: str, message: str) -> ConfigError:
    return ConfigError(f"{where(path, node)}: {key}: {message}{got(node, null_as_written=True)}")


# --- value parsers: node -> value, raising ValueError with the constraint -----

Parser = Callable[[yaml.Node], Any]

_BOOL = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _scalar(node: yaml.Node) -> yaml.ScalarNode:
    if not isinstance(node, yaml.ScalarNode):
        raise ValueError("expected a single value")
    return node


def parse_bool(node: yaml.Node) -> bool:
    value = _scalar(node).value.lower()
    if node.tag != BOOL or value not in _BOOL:
        raise ValueError("expected true or false")
    return _BOOL[value]


def _int(node: yaml.Node) -> int:
    scalar = _scalar(node)
    if scalar.tag != INT:
        raise ValueError("expected an integer")
    try:
        return int(scalar.value.replace("_", ""), 0)
    except ValueError:
        raise ValueError("expected an integer") from None


def positive_int(node: yaml.Node) -> int:
    value = _int(node)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def non_negative_int(node: yaml.Node) -> int:
    value = _int(node)
    if value < 0:
        raise ValueError("must be zero or a positive integer")
    return value


def non_negative_float(node: yaml.Node) -> float:
    scalar = _scalar(node)
    if scalar.tag not in (INT, FLOAT):
        raise ValueError("expected a number")
    try:
        value = float(scalar.value.replace("_", ""))
    except ValueError:
        raise ValueError("expected a number") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number >= 0")
    return value


def positive_float(node: yaml.Node) -> float:
    value = non_negative_float(node)
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def string(node: yaml.Node) -> str:
    scalar = _scalar(node)
    if scalar.tag != STR:
        raise ValueError("expected a string")
    return str(scalar.value)


def optional_string(node: yaml.Node) -> str | None:
    return None if is_null(node) else string(node)


def absolute_path(node: yaml.Node) -> Path:
    value = string(node)
    if not value.startswith("/"):
        raise ValueError("must be an absolute path")
    return Path(value)


def optional_absolute_path(node: yaml.Node) -> Path | None:
    return None if is_null(node) else absolute_path(node)


def web_url(node: yaml.Node) -> str:
    """``web.url``: empty, or an http(s) URL with a host (WebAuthn needs https, or http on localhost)."""
    from urllib.parse import urlsplit

    value = string(node).strip()
    if not value:
        return ""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be an https:// URL with a host (http:// only for localhost)")
    if parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1", "::1"):
        raise ValueError("http:// is only for localhost: browsers allow passkeys on https:// origins")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError("must be a plain URL (no user, query or fragment)")
    return value


def string_list(node: yaml.Node) -> tuple[str, ...]:
    if is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError("expected a list of strings")
    values = []
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode) or item.tag not in (STR, INT):
            raise ValueError("expected a list of strings")
        values.append(str(item.value))
    return tuple(values)


def command(node: yaml.Node) -> tuple[str, ...]:
    """A command as an argv list (or null for none)."""
    values = string_list(node)
    if values and not values[0].startswith("/"):
        raise ValueError("the command's first element must be an absolute path")
    return values


def label(node: yaml.Node) -> str:
    """A short name: up to 64 of ``A-Z a-z 0-9 . _ -`` (empty allowed)."""
    value = string(node)
    if len(value) > 64 or any(not (c.isascii() and (c.isalnum() or c in "._-")) for c in value):
        raise ValueError("expected up to 64 letters, digits, dots, underscores or hyphens")
    return value


def choice(*options: str) -> Parser:
    def parse(node: yaml.Node) -> str:
        value = string(node)
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return value

    return parse


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")


def env_patterns(node: yaml.Node) -> tuple[str, ...]:
    values = string_list(node)
    for value in values:
        if not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable name (a trailing * is allowed)")
    for index, value in enumerate(values):
        # env.allow serves root jobs too: a wildcard may not admit a name no root job may take.
        refused = envrule.wildcard_refusal(value)
        if refused is not None:
            raise NodeError(node.value[index], f"[{index}]", refused)
    return values


# --- nested values: errors point at the inner node ------------------------------


class NodeError(ValueError):
    """A problem inside a list or mapping value: ``node`` is where, ``key`` the sub-path (``[0].url``)."""

    def __init__(self, node: yaml.Node, key: str, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.key = key


def _fields(node: yaml.Node, prefix: str, known: Sequence[str]) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A mapping node's items by key (string keys, no duplicates, only ``known`` ones)."""
    if not isinstance(node, yaml.MappingNode):
        raise NodeError(node, prefix, "expected a mapping")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != STR:
            raise NodeError(key_node, prefix, "keys must be strings")
        key = str(key_node.value)
        if key in out:
            raise NodeError(key_node, f"{prefix}.{key}", "duplicate key")
        if key not in known:
            raise NodeError(key_node, f"{prefix}.{key}", f"unknown key (known: {', '.join(known)})")
        out[key] = (key_node, value_node)
    return out


def _field(items: dict[str, tuple[yaml.Node, yaml.Node]], key: str, prefix: str, parse: Parser, default: Any) -> Any:
    if key not in items:
        return default
    node = items[key][1]
    try:
        return parse(node)
    except NodeError:
        raise
    except ValueError as exc:
        raise NodeError(node, f"{prefix}.{key}", str(exc)) from None


@dataclass(frozen=True, slots=True)
class Observers:
    """The read-only operators: ``status``, ``pending``, ``show`` and ``events`` only."""

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"users": list(self.users), "groups": list(self.groups)}


def observers(node: yaml.Node) -> Observers:
    if is_null(node):
        return Observers()
    items = _fields(node, "", ("users", "groups"))
    return Observers(
        users=_field(items, "users", "", string_list, ()),
        groups=_field(items, "groups", "", string_list, ()),
    )


@dataclass(frozen=True, slots=True)
class SignerAccounts:
    """``approval.signer_accounts``: the operator account (the person) each allowed_signers principal is.

    One person, one vote (issue 27): a signed vote counts as its account's,
    so the same person approving by uid and by key is one approval.  A
    principal maps to one account; several principals may map to the same one.
    """

    pairs: tuple[tuple[str, str], ...] = ()  # (principal, account: a user name or uid)
    nodes: tuple[yaml.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)  # each account's node

    def account(self, principal: str) -> str | None:
        return next((account for p, account in self.pairs if p == principal), None)

    def to_dict(self) -> dict[str, str]:
        return dict(self.pairs)


def signer_accounts(node: yaml.Node) -> SignerAccounts:
    """A mapping principal -> account; the account must exist here (checked again as an operator in `_check`)."""
    if is_null(node):
        return SignerAccounts()
    if not isinstance(node, yaml.MappingNode):
        raise ValueError("expected a mapping of allowed_signers principal to operator account ({principal: user})")

    pairs: list[tuple[str, str]] = []
    nodes: list[yaml.Node] = []
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != STR or not key_node.value:
            raise NodeError(key_node, "", "keys must be principals (non-empty strings)")
        principal = str(key_node.value)
        if any(principal == p for p, _ in pairs):
            raise NodeError(key_node, f".{principal}", "duplicate mapping: a principal is one person")
        if not isinstance(value_node, yaml.ScalarNode) or value_node.tag not in (STR, INT) or not value_node.value:
            raise NodeError(value_node, f".{principal}", "expected an operator account (a user name or uid)")
        account = str(value_node.value)
        try:
            pwd.getpwuid(int(account)) if account.isdigit() else pwd.getpwnam(account)
        except KeyError:
            raise NodeError(value_node, f".{principal}", f"unknown account {account!r} (no such user)") from None
        pairs.append((principal, account))
        nodes.append(value_node)
    return SignerAccounts(tuple(pairs), tuple(nodes))


# Channel types and their keys: (key, parser, default); a default of REQUIRED must be given.
REQUIRED: Any = object()


def url(node: yaml.Node) -> str:
    value = string(node)
    if not re.fullmatch(r"https?://[^\s/?#]+[^\s]*", value):
        raise ValueError("must be an http:// or https:// URL")
    return value


def _port(node: yaml.Node) -> int:
    value = positive_int(node)
    if value > 65535:
        raise ValueError("must be a TCP port (1-65535)")
    return value


def _non_empty_strings(node: yaml.Node) -> tuple[str, ...]:
    values = string_list(node)
    if not values:
        raise ValueError("must name at least one address")
    return values


def _secret(node: yaml.Node) -> str:
    value = string(node)
    if len(value) < 16:
        raise ValueError("must be at least 16 characters")
    return value


def _channel_name(node: yaml.Node) -> str:
    value = string(node)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        raise ValueError("must be 1-64 letters, digits, '.', '_' or '-' (it names the channel's cursor file)")
    return value


_COMMON_CHANNEL_KEYS: tuple[tuple[str, Parser, Any], ...] = (
    ("name", _channel_name, None),
    ("rate_per_minute", positive_int, None),
)
CHANNEL_KEYS: dict[str, tuple[tuple[str, Parser, Any], ...]] = {
    "webhook": (("url", url, REQUIRED), ("secret", _secret, None), ("secret_file", absolute_path, None)),
    "ntfy": (
        ("url", url, REQUIRED),
        ("priority", choice("min", "low", "default", "high", "urgent"), "high"),
        ("tags", string_list, ("lock",)),
        ("token", optional_string, None),
        ("token_file", absolute_path, None),
    ),
    "slack": (("url", url, REQUIRED),),
    "email": (
        ("host", string, "localhost"),
        ("port", _port, 25),
        ("starttls", parse_bool, False),
        ("username", optional_string, None),
        ("password", optional_string, None),
        ("password_file", absolute_path, None),
        ("from", string, REQUIRED),
        ("to", _non_empty_strings, REQUIRED),
        ("timeout_seconds", positive_float, 30.0),
    ),
}


# Per channel type: the secrets that may instead be read from ``<key>_file`` at the relay's start.
SECRET_FILE_KEYS: dict[str, tuple[str, ...]] = {"webhook": ("secret",), "ntfy": ("token",), "email": ("password",)}


def channels(node: yaml.Node) -> tuple[dict[str, Any], ...]:
    """``notify.channels``: a list of ``{type: webhook|ntfy|slack|email, ...}``, each checked."""
    if is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError("expected a list of channels ({type: ..., ...})")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for index, item in enumerate(node.value):
        prefix = f"[{index}]"
        if not isinstance(item, yaml.MappingNode):
            raise NodeError(item, prefix, "expected a mapping with a type")
        type_node = next((v for k, v in item.value if isinstance(k, yaml.ScalarNode) and k.value == "type"), None)
        if type_node is None:
            raise NodeError(item, f"{prefix}.type", f"every channel needs a type ({', '.join(CHANNEL_KEYS)})")
        kind = _field({"type": (item, type_node)}, "type", prefix, choice(*CHANNEL_KEYS), None)
        spec = (("type", string, REQUIRED), *_COMMON_CHANNEL_KEYS, *CHANNEL_KEYS[kind])
        items = _fields(item, prefix, [k for k, _, _ in spec])
        channel: dict[str, Any] = {}
        for key, parse, default in spec:
            if default is REQUIRED and key not in items:
                raise NodeError(item, f"{prefix}.{key}", f"a {kind} channel needs {key}")
            channel[key] = _field(items, key, prefix, parse, default)
        # A secret may stand in a file of its own (readable by the relay only), not in this file.
        for key in SECRET_FILE_KEYS.get(kind, ()):
            if channel[key] is not None and channel[f"{key}_file"] is not None:
                raise NodeError(items[f"{key}_file"][1], f"{prefix}.{key}_file", f"give {key} or {key}_file, not both")
        if kind == "webhook" and channel["secret"] is None and channel["secret_file"] is None:
            raise NodeError(item, f"{prefix}.secret", "a webhook channel needs secret or secret_file")
        has_password = channel.get("password") is not None or channel.get("password_file") is not None
        if kind == "email" and (channel["username"] is None) == has_password:
            raise NodeError(item, prefix, "give both username and password (or password_file), or neither")
        channel["name"] = channel["name"] or f"{kind}-{index}"
        if channel["name"] in names:
            raise NodeError(
                items["name"][1] if "name" in items else item, f"{prefix}.name", "channel names must be unique"
            )
        names.add(channel["name"])
        out.append(channel)
    return tuple(out)


# --- the typed result ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Paths:
    runtime_dir: Path
    state_dir: Path
    policy_dir: Path


@dataclass(frozen=True, slots=True)
class Principals:
    users: tuple[str, ...]
    groups: tuple[str, ...]
    observers: Observers
    max_connections: int
    max_connections_per_user: int

    @property
    def connections_per_user(self) -> int:
        """The per-user cap on operator.sock in force: 0 stands for a quarter of max_connections, at least 1."""
        return self.max_connections_per_user or max(1, self.max_connections // 4)


@dataclass(frozen=True, slots=True)
class Agents:
    users: tuple[str, ...]
    groups: tuple[str, ...]
    require_token: bool


@dataclass(frozen=True, slots=True)
class Services:
    intake_user: str
    approval_user: str
    journal_user: str
    runner_user: str
    idle_exit_seconds: float
    stop_timeout_seconds: float


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int
    max_connections: int
    max_connections_per_agent: int
    read_timeout_seconds: float
    write_timeout_seconds: float
    request_timeout_seconds: float
    freshness_seconds: float
    clock_skew_seconds: float
    replay_window_seconds: float
    default_timeout_seconds: float
    max_output_bytes: int
    kill_grace_seconds: float
    search_cpu_seconds: int
    max_total_output_bytes: int = 32 * 1024 * 1024

    @property
    def connections_per_agent(self) -> int:
        """The per-agent cap in force: a setting of 0 stands for a quarter of max_connections.

        Derived when read, not when parsed, so a file that changes only
        max_connections moves the per-agent cap with it.
        """
        return self.max_connections_per_agent or max(1, self.max_connections // 4)


@dataclass(frozen=True, slots=True)
class Env:
    allow: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Approval:
    timeout_seconds: float
    allow_self_approval: bool
    ticket_ttl_seconds: float
    notify_command: tuple[str, ...]
    notify_timeout_seconds: float
    allowed_signers: Path = Path("/etc/airlock/allowed_signers")
    min_reason_length: int = 10
    operator_reason: str = "optional"
    max_grant_seconds: float = 8 * 3600.0
    signer_accounts: SignerAccounts = SignerAccounts()
    max_pending_per_agent: int = 10
    asks_per_minute: int = 20
    passkeys: Path = Path("/etc/airlock/passkeys")
    state_dir: Path = Path("/var/lib/airlock-approval")
    # Issue 34: the reviewer tier (approval/reviewer.py; the runner starts it, runner/review.py).
    reviewer_command: tuple[str, ...] = ()
    reviewer_user: str = "airlock-reviewer"
    reviewer_timeout_seconds: float = 10.0
    reviewer_name: str = ""
    reviewer_network: bool = False

    @property
    def reviewer_label(self) -> str:
        """The reviewer's name in records and messages: ``reviewer_name``, else its program's file name."""
        if self.reviewer_name:
            return self.reviewer_name
        base = self.reviewer_command[0].rsplit("/", 1)[-1] if self.reviewer_command else ""
        return "".join(c for c in base if c.isalnum() or c in "._-")[:64] or "reviewer"


@dataclass(frozen=True, slots=True)
class Web:
    url: str = ""
    rp_id: str = ""
    user: str = "airlock-web"
    enroll_minutes: float = 10.0
    listen: str = "127.0.0.1:8787"
    session_minutes: float = 15.0

    @property
    def origin(self) -> str:
        """The WebAuthn origin: ``scheme://host[:port]`` of ``url`` ("" when the web console is off)."""
        from urllib.parse import urlsplit

        if not self.url:
            return ""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def relying_party(self) -> str:
        """The WebAuthn RP ID: ``rp_id``, else the host of ``url``."""
        from urllib.parse import urlsplit

        return self.rp_id or (urlsplit(self.url).hostname or "" if self.url else "")


@dataclass(frozen=True, slots=True)
class Journal:
    operation_retention: float
    operation_capacity: int
    output_head_bytes: int
    anchor_every_records: int
    anchor_every_seconds: float
    checkpoint_key: Path = Path("/etc/airlock/checkpoint_ed25519_key")
    operation_capacity_per_agent: int = 256
    agent_bytes_per_second: int = 1024 * 1024
    agent_burst_bytes: int = 256 * 1024 * 1024
    # Segments and retention (issue 38; journal/segments.py).
    segment_max_bytes: int = 1024 * 1024 * 1024
    segment_max_age: float = 31 * 86400.0
    retention_max_age: float = 0.0
    retention_max_bytes: int = 0
    archive_dir: Path | None = None
    archive_max_age: float = 0.0
    archive_max_bytes: int = 0
    archive_delete_when: str = "never"
    disk_warn_percent: float = 10.0
    disk_warn_bytes: int = 1024 * 1024 * 1024
    disk_check_seconds: float = 60.0
    disk_warn_every_seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class Runner:
    containment: str
    slice: str
    memory_max: str | None
    tasks_max: int
    cpu_quota: str | None
    # Issue 35: each job's output kept by the runner (runner/outputlog.py).
    output_dir: Path = Path("/var/lib/airlock-runner/output")
    output_log_max_bytes: int = 8 * 1024 * 1024
    output_log_total_bytes: int = 1024 * 1024 * 1024
    output_log_max_age_seconds: float = 30 * 86400.0
    exec_tree_max: int = 256
    exec_tree_source: str = "auto"


@dataclass(frozen=True, slots=True)
class Log:
    level: str
    target: str


@dataclass(frozen=True, slots=True)
class Notify:
    channels: tuple[dict[str, Any], ...]
    user: str
    state_dir: Path
    host: str | None
    poll_seconds: float
    digest_seconds: float
    remind_seconds: float
    rate_per_minute: int
    backoff_max_seconds: float


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
    web: Web = Web()
    # Where the config came from, and the raw ``policy:`` node for the policy engine.
    source: str = "<built-in>"
    policy_node: yaml.Node | None = dataclasses.field(default=None, compare=False, repr=False)

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

# Channel keys never shown by `airlock config show`.
_SECRET_CHANNEL_KEYS = frozenset({"secret", "password", "token"})


def _public(value: Any) -> Any:
    """A list item for to_dict(): channel secrets are masked, everything else as is."""
    if isinstance(value, dict):
        return {
            k: (
                "[set]"
                if k in _SECRET_CHANNEL_KEYS and v is not None
                else list(v)
                if isinstance(v, tuple)
                else str(v)
                if isinstance(v, Path)
                else v
            )
            for k, v in value.items()
        }
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    key: str
    parse: Parser
    default: Any
    help: str


MiB = 1024 * 1024
# The approval window when operators are reached off the box (notify.channels) and
# approval.timeout_seconds is not set: 60 s fits a person at the console, not a phone.
RELAYED_APPROVAL_TIMEOUT = 600.0
# The most limits.max_total_output_bytes may be: base64 (4/3) of it and a 64-stage reply fit in common/ipc.py's 96 MiB.
MAX_TOTAL_OUTPUT = 48 * MiB

SETTINGS: tuple[Setting, ...] = (
    Setting("paths.runtime_dir", absolute_path, Path("/run/airlock"), "Where the sockets live."),
    Setting("paths.state_dir", absolute_path, Path("/var/lib/airlock"), "The journal's database lives here."),
    Setting(
        "paths.policy_dir",
        absolute_path,
        Path("/etc/airlock/policy.d"),
        "Extra policy files (*.yaml), read in name order.",
    ),
    Setting(
        "agents.users",
        string_list,
        (),
        "Users (names or uids) allowed on agent.sock; empty with no groups means anyone who can open it.",
    ),
    Setting("agents.groups", string_list, (), "Groups whose members are allowed on agent.sock."),
    Setting("agents.require_token", parse_bool, False, "Refuse agent requests that carry no valid session token."),
    Setting("operators.users", string_list, (), "Users (names or uids) allowed on operator.sock; root always is."),
    Setting("operators.groups", string_list, ("airlock-admin",), "Groups whose members are operators."),
    Setting(
        "operators.observers",
        observers,
        Observers(),
        "Read-only operators ({users: [...], groups: [...]}): status, pending, show and events only; every other "
        "operator verb answers unauthorized.",
    ),
    Setting(
        "operators.max_connections",
        positive_int,
        64,
        "Connections operator.sock handles at once (operators and observers together); more get 'busy'.",
    ),
    Setting(
        "operators.max_connections_per_user",
        non_negative_int,
        0,
        "Connections one user (peer uid, root included) may hold on operator.sock; more get 'busy' (0: a quarter "
        "of operators.max_connections, at least 1).",
    ),
    Setting("services.intake_user", string, "airlock-intake", "The user airlock-intake runs as."),
    Setting("services.approval_user", string, "airlock-approval", "The user airlock-approval runs as."),
    Setting("services.journal_user", string, "airlock-journal", "The user airlock-journal runs as."),
    Setting("services.runner_user", string, "root", "The user airlock-runner runs as."),
    Setting(
        "services.idle_exit_seconds",
        non_negative_float,
        300.0,
        "A socket-activated service exits after this long without work (0: never).",
    ),
    Setting(
        "services.stop_timeout_seconds", positive_float, 20.0, "On stop, how long in-flight work may take to finish."
    ),
    Setting("limits.max_request_bytes", positive_int, 1 * MiB, "Longest request line, newline included."),
    Setting("limits.max_connections", positive_int, 64, "Agent connections handled at once; more get 'busy'."),
    Setting(
        "limits.max_connections_per_agent",
        non_negative_int,
        0,
        "Connections one agent (peer uid) may hold at once; more get 'busy' (0: a quarter of "
        "limits.max_connections, at least 1).",
    ),
    Setting("limits.read_timeout_seconds", positive_float, 10.0, "Longest wait for the next bytes of a request."),
    Setting(
        "limits.write_timeout_seconds",
        positive_float,
        10.0,
        "A client that does not take its reply's bytes within this long is disconnected.",
    ),
    Setting("limits.request_timeout_seconds", positive_float, 30.0, "Longest time to receive a whole request."),
    Setting("limits.freshness_seconds", positive_float, 60.0, "Requests whose time is older than this are rejected."),
    Setting("limits.clock_skew_seconds", non_negative_float, 5.0, "How far in the future a request's time may be."),
    Setting(
        "limits.replay_window_seconds",
        positive_float,
        300.0,
        "How long a request ID is remembered (at least twice freshness_seconds).",
    ),
    Setting("limits.default_timeout_seconds", positive_float, 300.0, "A job's timeout when the request names none."),
    Setting("limits.max_output_bytes", positive_int, 16 * MiB, "Default and ceiling for captured bytes per stream."),
    Setting(
        "limits.max_total_output_bytes",
        positive_int,
        32 * MiB,
        "Captured bytes of one request across all stages and streams (stdout and every stage's stderr); "
        "past it the rest is read and dropped, and the streams that lost bytes are marked truncated "
        f"(at most {MAX_TOTAL_OUTPUT // MiB} MiB, so the reply always fits).",
    ),
    Setting("limits.kill_grace_seconds", non_negative_float, 1.0, "Between SIGTERM and SIGKILL of a job."),
    Setting(
        "limits.search_cpu_seconds",
        positive_int,
        5,
        "CPU seconds (RLIMIT_CPU) one files_search may use before it is stopped with limit_exceeded.",
    ),
    Setting(
        "env.allow",
        env_patterns,
        ("LANG", "TZ", "DEBIAN_FRONTEND", "TERM", "LC_*"),
        "Environment variables a request may set (a trailing * matches a prefix).",
    ),
    Setting(
        "approval.timeout_seconds",
        positive_float,
        60.0,
        f"How long a request may wait for an operator; when unset and notify.channels is not empty, "
        f"{RELAYED_APPROVAL_TIMEOUT:g} (a phone notification, an SSH login or a signature round trip fits).",
    ),
    Setting("approval.allow_self_approval", parse_bool, False, "Whether an operator may approve their own request."),
    Setting("approval.ticket_ttl_seconds", positive_float, 10.0, "How long an approval ticket stays redeemable."),
    Setting(
        "approval.notify_command",
        command,
        (),
        "Run (argv, absolute path first) with each pending request as JSON on stdin.",
    ),
    Setting("approval.notify_timeout_seconds", positive_float, 10.0, "How long the notify command may run."),
    Setting(
        "approval.allowed_signers",
        absolute_path,
        Path("/etc/airlock/allowed_signers"),
        "An OpenSSH allowed_signers file: whose ssh-keygen signatures (namespace airlock-approval) approve or deny; "
        "absent: signed approvals are off. Must be readable by airlock-approval.",
    ),
    Setting(
        "approval.signer_accounts",
        signer_accounts,
        SignerAccounts(),
        "The operator account each allowed_signers principal is ({principal: user}): a signed vote is that "
        "person's vote. An unmapped principal counts only where no quorum and no self-approval check applies.",
    ),
    Setting(
        "approval.min_reason_length",
        non_negative_int,
        10,
        "Characters (after trimming) a reason must have where one is required (a rule's reason: required, "
        "approval.operator_reason).",
    ),
    Setting(
        "approval.operator_reason",
        choice("optional", "required"),
        "optional",
        "required: an operator approving privileged work must give a reason of approval.min_reason_length characters.",
    ),
    Setting(
        "approval.max_grant_seconds",
        positive_float,
        8 * 3600.0,
        "The longest time-boxed grant an operator may give (airlock approve --grant).",
    ),
    Setting(
        "approval.max_pending_per_agent",
        positive_int,
        10,
        "Requests one agent (peer uid) may have waiting for an operator at once; more are refused with rate_limited.",
    ),
    Setting(
        "approval.asks_per_minute",
        positive_int,
        20,
        "Requests one agent (peer uid) may put before operators in any 60 s; more are refused with rate_limited.",
    ),
    Setting(
        "approval.passkeys",
        absolute_path,
        Path("/etc/airlock/passkeys"),
        "The enrolled passkeys (one JSON object per line: credential ID, COSE public key, operator account, "
        "created, revoked), root's, written only by the runner for approval (airlock passkey); read by approval "
        "at every use, so an edit or a revocation applies at once. Absent: no passkey is enrolled.",
    ),
    Setting(
        "approval.state_dir",
        absolute_path,
        Path("/var/lib/airlock-approval"),
        "approval's own state (its unit's StateDirectory=): the passkeys' sign counters, kept across restarts.",
    ),
    Setting(
        "approval.reviewer_command",
        command,
        (),
        "The reviewer (argv, absolute path first): gets each request a person would be asked about as JSON on "
        'stdin and answers {"decision": "allow|deny|ask", "reason": "..."}; rules\' reviewer: says where '
        "its answer decides. Empty: no reviewer. Started by airlock-runner, sandboxed, as approval.reviewer_user.",
    ),
    Setting(
        "approval.reviewer_user",
        string,
        "airlock-reviewer",
        "The unprivileged user the reviewer runs as (never root; missing: the reviewer is off and people are asked).",
    ),
    Setting(
        "approval.reviewer_timeout_seconds",
        positive_float,
        10.0,
        "How long the reviewer may take; then it is killed and people are asked.",
    ),
    Setting(
        "approval.reviewer_name",
        label,
        "",
        "The reviewer's name in the journal and in messages (by: reviewer NAME); empty: its program's file name.",
    ),
    Setting(
        "approval.reviewer_network",
        parse_bool,
        False,
        "Whether the reviewer may use the network (a model-backed reviewer calling an API); off: no network at all.",
    ),
    Setting("journal.operation_retention", positive_float, 300.0, "Seconds a completed operation can be replayed."),
    Setting(
        "journal.operation_capacity",
        positive_int,
        4096,
        "Completed operations kept for replay, all agents together; when full, a new operation of an agent with "
        "no outcome of its own to give up gets 'busy' (another agent's unexpired outcome is never evicted).",
    ),
    Setting(
        "journal.operation_capacity_per_agent",
        positive_int,
        256,
        "Completed operations kept for replay per agent (peer uid); past it the agent's own oldest goes.",
    ),
    Setting(
        "journal.agent_bytes_per_second",
        non_negative_int,
        1 * MiB,
        "Audit journal bytes one agent's (peer uid's) requests may write per second, sustained; a new request "
        "past the quota gets 'rate_limited' and nothing of it is written (0: no quota).",
    ),
    Setting(
        "journal.agent_burst_bytes",
        positive_int,
        256 * MiB,
        "Audit journal bytes one agent's requests may write in a burst above journal.agent_bytes_per_second.",
    ),
    Setting(
        "journal.output_head_bytes",
        non_negative_int,
        0,
        "Bytes of each output stream kept in the audit record (0: digest and size only).",
    ),
    Setting(
        "journal.anchor_every_records",
        non_negative_int,
        1000,
        "Anchor the chain head outside the database after this many records (0: only at start and stop).",
    ),
    Setting(
        "journal.anchor_every_seconds",
        non_negative_float,
        300.0,
        "Anchor the chain head at least this often while records are written (0: only at start and stop).",
    ),
    Setting(
        "journal.checkpoint_key",
        absolute_path,
        Path("/etc/airlock/checkpoint_ed25519_key"),
        "The host's checkpoint key (OpenSSH ed25519, made at install, readable only by airlock-journal): every "
        "anchor is signed with it (ssh-keygen -Y sign, namespace airlock-checkpoint); `airlock audit host-key` "
        "prints its public half. Absent: anchors go unsigned (logged).",
    ),
    Setting(
        "journal.segment_max_bytes",
        non_negative_int,
        1024 * MiB,
        "Seal the live audit segment and start a new one once its database reaches this size (0: never by size).",
    ),
    Setting(
        "journal.segment_max_age",
        non_negative_float,
        31 * 86400.0,
        "Seal the live audit segment once its first record is this many seconds old (0: never by age).",
    ),
    Setting(
        "journal.retention_max_age",
        non_negative_float,
        0.0,
        "Move a sealed segment to the archive folder once it was sealed this many seconds ago (0: never by age).",
    ),
    Setting(
        "journal.retention_max_bytes",
        non_negative_int,
        0,
        "Move the oldest sealed segments to the archive folder while the sealed segments beside the live one "
        "take more than this many bytes (0: no limit).",
    ),
    Setting(
        "journal.archive_dir",
        optional_absolute_path,
        None,
        "Where archived segments go (unset: journal-archive in the state folder).",
    ),
    Setting(
        "journal.archive_max_age",
        non_negative_float,
        0.0,
        "An archived segment sealed this many seconds ago may be deleted, if journal.archive_delete_when holds "
        "(0: never by age).",
    ),
    Setting(
        "journal.archive_max_bytes",
        non_negative_int,
        0,
        "While the archive holds more than this many bytes its oldest segments may be deleted, if "
        "journal.archive_delete_when holds (0: no limit).",
    ),
    Setting(
        "journal.archive_delete_when",
        choice("never", "shipped", "confirmed"),
        "never",
        "When an archived segment past its limit is deleted: never; shipped (the fleet collector's "
        "acknowledgement covers its last record); confirmed (an operator ran `airlock audit archive --confirm`). "
        "Each deletion is journaled with the segment's range and final hash.",
    ),
    Setting(
        "journal.disk_warn_percent",
        non_negative_float,
        10.0,
        "Warn (journald, airlock status) when the journal's filesystem has less than this percent free (0: never).",
    ),
    Setting(
        "journal.disk_warn_bytes",
        non_negative_int,
        1024 * 1024 * 1024,
        "Warn when the journal's filesystem has fewer than this many bytes free (0: never); either threshold warns.",
    ),
    Setting(
        "journal.disk_check_seconds",
        positive_float,
        60.0,
        "How often the journal looks at its filesystem's free space.",
    ),
    Setting(
        "journal.disk_warn_every_seconds",
        positive_float,
        3600.0,
        "While space stays low the warning is repeated at most this often.",
    ),
    Setting(
        "runner.containment",
        choice(*containment.SETTING),
        "auto",
        "service: each job stage a transient systemd service (a rule's sandbox applies); scope: a transient scope "
        "around the runner's children; auto: service when systemd runs and the runner is root, else a process group.",
    ),
    Setting("runner.slice", string, "airlock-jobs.slice", "The slice job scopes are placed in."),
    Setting("runner.memory_max", optional_string, None, "MemoryMax= of each job scope (e.g. 2G)."),
    Setting("runner.tasks_max", non_negative_int, 0, "TasksMax= of each job scope (0: systemd's default)."),
    Setting("runner.cpu_quota", optional_string, None, "CPUQuota= of each job scope (e.g. 200%)."),
    Setting(
        "runner.output_dir",
        absolute_path,
        Path("/var/lib/airlock-runner/output"),
        "Where the runner keeps each job's output log (root only, gzip; `airlock show ID --output`).",
    ),
    Setting(
        "runner.output_log_max_bytes",
        non_negative_int,
        8 * MiB,
        "Output bytes (stdout and stderr, redacted) kept per job; past it the log is cut and says so (0: no logs).",
    ),
    Setting(
        "runner.output_log_total_bytes",
        positive_int,
        1024 * MiB,
        "Disk bytes all output logs may take together; the oldest are pruned first.",
    ),
    Setting(
        "runner.output_log_max_age_seconds",
        positive_float,
        30 * 86400.0,
        "Output logs older than this are pruned (30 days).",
    ),
    Setting(
        "runner.exec_tree_max",
        non_negative_int,
        256,
        "Programs a job executed recorded in its exec.finished (its exec tree; the rest are counted as more; "
        "0: no exec tree).",
    ),
    Setting(
        "runner.exec_tree_source",
        choice("auto", "connector", "fanotify"),
        "auto",
        "Where exec trees come from: the process-events connector, fanotify exec opens (service containment "
        "only), or auto: the connector, else fanotify (a container).",
    ),
    Setting("log.level", choice("debug", "info", "warning", "error"), "info", "The lowest level logged."),
    Setting(
        "log.target",
        choice("auto", "journal", "stderr"),
        "auto",
        "auto: journald when stderr is the journal, else JSON lines on stderr.",
    ),
    Setting(
        "notify.channels",
        channels,
        (),
        "Where airlock-notify sends pending requests and their outcome: a list of "
        "{type: webhook|ntfy|slack|email, ...} (docs/configuration.md lists each type's keys).",
    ),
    Setting(
        "notify.user",
        string,
        "airlock-notify",
        "The user airlock-notify runs as (make it an operators.observers user, not an operator).",
    ),
    Setting(
        "notify.state_dir",
        absolute_path,
        Path("/var/lib/airlock-notify"),
        "airlock-notify keeps its delivery cursors and status.json (for airlock status) here.",
    ),
    Setting(
        "notify.host",
        optional_string,
        None,
        "The host name messages give (and the ssh line uses); null: this machine's name.",
    ),
    Setting("notify.poll_seconds", positive_float, 0.5, "How often airlock-notify reads the events feed."),
    Setting(
        "notify.digest_seconds",
        non_negative_float,
        0.0,
        "Pending requests that arrive within this long of each other go as one digest message (0: one message each).",
    ),
    Setting(
        "notify.remind_seconds",
        non_negative_float,
        0.0,
        "Send a reminder when a pending request has this long left (0: no reminders).",
    ),
    Setting(
        "notify.rate_per_minute",
        positive_int,
        30,
        "Messages one channel may send per minute; more wait (a channel's rate_per_minute overrides it).",
    ),
    Setting(
        "notify.backoff_max_seconds",
        positive_float,
        300.0,
        "The longest wait between retries of a failed delivery (it doubles from 1 s).",
    ),
    Setting(
        "web.url",
        web_url,
        "",
        "The public URL of airlock-web (https://host.example/); its scheme://host[:port] is the WebAuthn origin "
        "passkeys are checked against. Empty: the web console and passkeys are off.",
    ),
    Setting("web.rp_id", string, "", "The WebAuthn relying party ID; empty: the host of web.url."),
    Setting(
        "web.user",
        string,
        "airlock-web",
        "The user airlock-web runs as: admitted on operator.sock as an observer that may also carry passkey "
        "verbs (it decides nothing by itself).",
    ),
    Setting(
        "web.enroll_minutes",
        positive_float,
        10.0,
        "How long an enrollment link (airlock passkey enroll) stays valid.",
    ),
)

WEB_PORT = 8787  # airlock-web's default port on 127.0.0.1 (docs/operations.md)


def web_listen(node: yaml.Node) -> str:
    """``HOST:PORT`` (an IPv6 host in brackets) or an absolute Unix socket path for a reverse proxy."""
    text = string(node)
    if text.startswith("/"):
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT (e.g. 127.0.0.1:8787) or an absolute Unix socket path")
    return text


SETTINGS += (
    Setting(
        "web.listen",
        web_listen,
        f"127.0.0.1:{WEB_PORT}",
        "Where airlock-web listens when started by hand: HOST:PORT or a Unix socket path for a reverse proxy "
        "(under systemd, airlock-web.socket's ListenStream= decides).",
    ),
    Setting(
        "web.session_minutes",
        positive_float,
        15.0,
        "How long an airlock-web sign-in lasts; then the passkey signs in again.",
    ),
)

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
            raise _fail(path, key_node, prefix or "(top level)", "keys must be strings")
        key = str(key_node.value)
        full = f"{prefix}.{key}" if prefix else key
        if key in seen:
            raise _fail(path, key_node, full, "duplicate key")
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
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(syntax_error(path, exc)) from None
    if root is None or is_null(root):
        return _build(values, path, policy_node)
    if not isinstance(root, yaml.MappingNode):
        raise _fail(path, root, "(top level)", "the file must be a mapping of sections")
    for section, key_node, section_node in _mapping_items(root, path, ""):
        if section == "policy":
            policy_node = section_node
            continue
        if section not in _SECTIONS:
            raise _fail(
                path, key_node, section, f"unknown section (known: {', '.join(sorted([*_SECTIONS, 'policy']))})"
            )
        if is_null(section_node):
            continue
        if not isinstance(section_node, yaml.MappingNode):
            raise _fail(path, section_node, section, "expected a mapping")
        for name, name_node, value_node in _mapping_items(section_node, path, section):
            key = f"{section}.{name}"
            found = _BY_KEY.get(key)
            if found is None:
                known = sorted(s.key.split(".", 1)[1] for s in SETTINGS if s.key.startswith(section + "."))
                raise _fail(path, name_node, key, f"unknown key (known in {section}: {', '.join(known)})")
            try:
                values[key] = found.parse(value_node)
            except NodeError as exc:
                raise _fail(path, exc.node, f"{key}{exc.key}", str(exc)) from None
            except ValueError as exc:
                raise _fail(path, value_node, key, str(exc)) from None
            given.add(key)
    if values["notify.channels"] and "approval.timeout_seconds" not in given and base == defaults():
        values["approval.timeout_seconds"] = RELAYED_APPROVAL_TIMEOUT
    config = _build(values, path, policy_node)
    _check(config, path)
    return config


def _check(config: Config, path: str) -> None:
    _check_signer_accounts(config, path)
    _check_output_log(config, path)
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
            raise _fail(
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
