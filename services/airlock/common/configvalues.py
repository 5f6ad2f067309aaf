"""The settings' value parsers: YAML nodes to typed values, every error at its node.

Each parser takes a composed YAML node (so errors keep line and column) and
returns the value or raises ``ValueError`` (``NodeError`` for a node inside
it); `config.parse_text` turns either into a `ConfigError` in the
``path:line:col: key.path: message (got 'value')`` form.  A settings row
(`Setting`) names its parser.
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

from airlock.common import envrule
from airlock.common.yamlnodes import BOOL, FLOAT, INT, STR, got, is_null, where


class ConfigError(Exception):
    """A configuration problem, already rendered for a human."""


def fail_at(path: str, node: yaml.Node | None, key: str, message: str) -> ConfigError:
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


def fields_of(node: yaml.Node, prefix: str, known: Sequence[str]) -> dict[str, tuple[yaml.Node, yaml.Node]]:
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


def field_of(items: dict[str, tuple[yaml.Node, yaml.Node]], key: str, prefix: str, parse: Parser, default: Any) -> Any:
    if key not in items:
        return default
    node = items[key][1]
    try:
        return parse(node)
    except NodeError:
        raise
    except ValueError as exc:
        raise NodeError(node, f"{prefix}.{key}", str(exc)) from None


def host_groups(node: yaml.Node) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``web.fleet_groups``: a mapping of group name -> a list of hosts (each as ``web.fleet_hosts`` names it)."""
    if is_null(node):
        return ()
    if not isinstance(node, yaml.MappingNode):
        raise ValueError("expected a mapping of group name to a list of hosts")
    out: dict[str, tuple[str, ...]] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != STR or not str(key_node.value).strip():
            raise NodeError(key_node, "", "group names must be non-empty strings")
        name = str(key_node.value)
        if name in out:
            raise NodeError(key_node, f".{name}", "duplicate group")
        try:
            hosts = string_list(value_node)
        except ValueError as exc:
            raise NodeError(value_node, f".{name}", str(exc)) from None
        if not hosts:
            raise NodeError(value_node, f".{name}", "a group lists at least one host")
        out[name] = hosts
    return tuple(out.items())


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
    items = fields_of(node, "", ("users", "groups"))
    return Observers(
        users=field_of(items, "users", "", string_list, ()),
        groups=field_of(items, "groups", "", string_list, ()),
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


# A key's default that says: it must be given (a notification channel's url, ...).
REQUIRED: Any = object()


def url(node: yaml.Node) -> str:
    value = string(node)
    if not re.fullmatch(r"https?://[^\s/?#]+[^\s]*", value):
        raise ValueError("must be an http:// or https:// URL")
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    key: str
    parse: Parser
    default: Any
    help: str


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
