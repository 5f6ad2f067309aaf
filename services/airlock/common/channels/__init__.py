"""Notification channels (``notify.channels``): one module per channel type, found here; the entries parsed.

A channel type is one file in this package defining a `base.Channel` subclass
and naming it ``CHANNEL``: its keys, secrets, body and send.  Nothing else
lists the types: the config's parser, ``airlock config show``'s masking and
the relay all read `CHANNELS`.  To add one, copy ``slack.py`` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Mapping
from typing import Any

import yaml

from airlock.common.channels.base import REQUIRED, Channel, Key, RuleError
from airlock.common.configvalues import NodeError, choice, field_of, fields_of, positive_int, string
from airlock.common.yamlnodes import is_null


def _discover() -> dict[str, type[Channel]]:
    found: dict[str, type[Channel]] = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name == "base":
            continue
        cls = getattr(importlib.import_module(f"{__name__}.{module.name}"), "CHANNEL", None)
        if not (isinstance(cls, type) and issubclass(cls, Channel)) or cls.kind in found:
            raise ImportError(f"{__name__}.{module.name} must name one new Channel subclass as CHANNEL")
        found[cls.kind] = cls
    return dict(sorted(found.items()))


# Channel type -> its class: the one registry.
CHANNELS: dict[str, type[Channel]] = _discover()


def channel_name(node: yaml.Node) -> str:
    value = string(node)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        raise ValueError("must be 1-64 letters, digits, '.', '_' or '-' (it names the channel's cursor file)")
    return value


# The keys every channel takes, before its own.
COMMON_KEYS = (Key("type", string, REQUIRED), Key("name", channel_name, None), Key("rate_per_minute", positive_int))


def parse(node: yaml.Node) -> tuple[Channel, ...]:
    """``notify.channels``: a list of ``{type: <a channel type>, ...}``, each checked by its class."""
    if is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError("expected a list of channels ({type: ..., ...})")
    out: list[Channel] = []
    names: set[str] = set()
    for index, item in enumerate(node.value):
        prefix = f"[{index}]"
        if not isinstance(item, yaml.MappingNode):
            raise NodeError(item, prefix, "expected a mapping with a type")
        type_node = next((v for k, v in item.value if isinstance(k, yaml.ScalarNode) and k.value == "type"), None)
        if type_node is None:
            raise NodeError(item, f"{prefix}.type", f"every channel needs a type ({', '.join(CHANNELS)})")
        kind = field_of({"type": (item, type_node)}, "type", prefix, choice(*CHANNELS), None)
        cls = CHANNELS[kind]
        spec = (*COMMON_KEYS, *cls.all_keys())
        items = fields_of(item, prefix, [key.name for key in spec])
        channel: dict[str, Any] = {}
        for key in spec:
            if key.default is REQUIRED and key.name not in items:
                raise NodeError(item, f"{prefix}.{key.name}", f"a {kind} channel needs {key.name}")
            channel[key.name] = field_of(items, key.name, prefix, key.parse, key.default)
        # A secret may stand in a file of its own (readable by the relay only), not in this file.
        for secret in cls.secret_keys():
            if channel[secret] is not None and channel[f"{secret}_file"] is not None:
                raise NodeError(
                    items[f"{secret}_file"][1], f"{prefix}.{secret}_file", f"give {secret} or {secret}_file, not both"
                )
        try:
            cls.check(channel)
        except RuleError as exc:
            raise NodeError(item, f"{prefix}.{exc.key}" if exc.key else prefix, str(exc)) from None
        channel["name"] = channel["name"] or f"{kind}-{index}"
        if channel["name"] in names:
            raise NodeError(
                items["name"][1] if "name" in items else item, f"{prefix}.name", "channel names must be unique"
            )
        names.add(channel["name"])
        out.append(cls(channel))
    return tuple(out)


def of(settings: Mapping[str, Any]) -> Channel:
    """The channel an entry of ``notify.channels`` (as `parse` made it) configures."""
    return CHANNELS[settings["type"]](settings)


def public(settings: Mapping[str, Any]) -> dict[str, Any]:
    """An entry as ``airlock config show`` prints it: its secrets masked, tuples as lists, paths as text."""
    secrets = CHANNELS[settings["type"]].secret_keys()
    return {k: "[set]" if k in secrets and v is not None else _shown(v) for k, v in settings.items()}


def _shown(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
