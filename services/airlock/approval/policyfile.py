"""Policy files: YAML to rules, every problem with its line.

A policy file is the ``policy:`` node of airlock.yaml (``default`` and
``rules``) or one ``policy.d/*.yaml`` (``rules`` only).  A file with any error
is rejected whole: `PolicyError` lists every problem found, each as
``path:line:col: key.path: message (got 'value')``.  Each rule's fields are
read by `airlock.approval.policyfields`; here they become rules, and rules
files.  Pure apart from what policyfields looks at (the binaries, credential
files and accounts a rule names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from airlock.approval.policyfields import FieldReader, Invalid
from airlock.approval.rules import DEFAULT_RULE, UNRESOLVED_RULE, Rule, RuleMode, Verdict
from airlock.common import yamlnodes
from airlock.common.yamlnodes import BOOL, STR, is_null, where

# Pseudo-rule names a decision can carry (rules.py); no real rule may take them.
_RESERVED = frozenset({DEFAULT_RULE, UNRESOLVED_RULE})
_RULE_KEYS = (
    "approvals",
    "approvers",
    "commands",
    "credentials",
    "cwd",
    "decision",
    "description",
    "files",
    "groups",
    "mode",
    "name",
    "privileged",
    "reason",
    "reviewer",
    "run_as",
    "sandbox",
    "sessions",
    "stdin",
    "users",
    "writable_arguments",
)
_MAIN_KEYS = ("default", "rules")


class PolicyError(Exception):
    """A rejected policy; ``errors`` holds one rendered line per problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """One parsed file (or the policy: node of airlock.yaml), before assembly."""

    path: str
    default: Verdict | None  # only airlock.yaml's policy: node may set it
    rules: tuple[Rule, ...]
    warnings: tuple[str, ...] = ()
    # (name, location of the name node, key path of the rule): for duplicate errors.
    name_sites: tuple[tuple[str, str, str], ...] = field(default=(), compare=False, repr=False)


def _rules(reader: FieldReader, node: yaml.Node, key: str) -> tuple[list[Rule], list[tuple[str, str, str]]]:
    if is_null(node):
        return [], []
    if not isinstance(node, yaml.SequenceNode):
        raise reader.fail(node, key, "expected a list of rules")
    rules, sites = [], []
    for index, item in enumerate(node.value):
        try:
            rule, site = _rule(reader, item, f"{key}[{index}]")
        except Invalid:
            continue
        rules.append(rule)
        sites.append(site)
    return rules, sites


def _rule(reader: FieldReader, node: yaml.Node, key: str) -> tuple[Rule, tuple[str, str, str]]:
    if not isinstance(node, yaml.MappingNode):
        raise reader.fail(node, key, "expected a rule (a mapping with name, decision, ...)")
    items = reader.items(node, key)
    values = {name: value for name, _, value in items}
    # The name first, so every later message can say which rule it is about.
    if "name" not in values:
        raise reader.fail(node, key, "missing name (every rule needs a unique name)", got=False)
    name_node = values["name"]
    name = reader.string(name_node, f"{key}.name", "a rule name")
    if not name or any(c.isspace() or not c.isprintable() for c in name) or len(name) > 128:
        raise reader.fail(name_node, f"{key}.name", "a rule name is 1 to 128 characters without spaces")
    if name in _RESERVED:
        raise reader.fail(name_node, f"{key}.name", f"{name!r} is reserved for decisions no rule made")
    key = f"{key} ({name})"
    for item_name, key_node, _ in items:
        if item_name not in _RULE_KEYS:
            raise reader.fail(
                key_node, f"{key}.{item_name}", f"unknown key (known: {', '.join(_RULE_KEYS)})", got=False
            )
    if "decision" not in values:
        raise reader.fail(node, key, "missing decision (allow, ask or deny)", got=False)
    decision = reader.verdict(values["decision"], f"{key}.decision")

    def names(field_name: str, *, numbers: bool = False) -> frozenset[str]:
        if field_name not in values:
            return frozenset()
        return reader.names(values[field_name], f"{key}.{field_name}", numbers=numbers)

    privileged: bool | None = None
    if "privileged" in values:
        flag = values["privileged"]
        if not isinstance(flag, yaml.ScalarNode) or flag.tag != BOOL:
            raise reader.fail(flag, f"{key}.privileged", "expected true or false (leave it out to mean either)")
        privileged = flag.value.lower() in ("true", "yes", "on")
    commands = reader.commands(values["commands"], f"{key}.commands") if "commands" in values else None
    if commands and privileged and decision != "deny":
        reader.warn_untrusted(values["commands"], f"{key}.commands", commands)
    files = reader.files(values["files"], f"{key}.files") if "files" in values else None
    description = reader.string(values["description"], f"{key}.description") if "description" in values else ""
    confined = reader.sandbox(values["sandbox"], f"{key}.sandbox") if "sandbox" in values else None
    secrets = (
        reader.credentials(values["credentials"], f"{key}.credentials", privileged) if "credentials" in values else None
    )
    approvals, approvers, reason_required = reader.quorum(values, key, decision)
    writable = False
    if "writable_arguments" in values:
        node = values["writable_arguments"]
        if not isinstance(node, yaml.ScalarNode) or node.tag != STR or node.value not in ("allow", "ask"):
            raise reader.fail(node, f"{key}.writable_arguments", "must be allow or ask")
        if node.value == "allow" and decision != "allow":
            raise reader.fail(
                node, f"{key}.writable_arguments", "allow applies only to a rule with decision: allow", got=False
            )
        writable = node.value == "allow"
    reviewer = reader.reviewer(values, key, decision, approvals, approvers)
    mode = RuleMode.ENFORCE
    if "mode" in values:
        node = values["mode"]
        if not isinstance(node, yaml.ScalarNode) or node.tag != STR or node.value not in set(RuleMode):
            raise reader.fail(node, f"{key}.mode", "must be enforce or shadow")
        mode = RuleMode(node.value)
    cwd = reader.cwd(values["cwd"], f"{key}.cwd") if "cwd" in values else None
    stdin = reader.stdin(values["stdin"], f"{key}.stdin") if "stdin" in values else None
    rule = Rule(
        name=name,
        decision=decision,
        users=names("users", numbers=True),
        groups=names("groups"),
        sessions=names("sessions"),
        privileged=privileged,
        run_as=(names("run_as", numbers=True) or None) if "run_as" in values else None,
        commands=commands,
        source=f"{reader.path}:{node.start_mark.line + 1}",
        files=files,
        description=description,
        sandbox=confined,
        approvals=approvals,
        approvers=approvers,
        reason_required=reason_required,
        writable_arguments=writable,
        reviewer=reviewer,
        mode=mode,
        credentials=secrets,
        cwd=cwd,
        stdin=stdin,
    )
    return rule, (name, where(reader.path, name_node), key)


def _compose(text: str, path: str) -> yaml.Node | None:
    try:
        return yamlnodes.compose(text)
    except yaml.YAMLError as exc:
        raise PolicyError([yamlnodes.syntax_error(path, exc)]) from None


def parse_policy_node(node: yaml.Node | None, path: str, *, key: str = "policy") -> PolicyFile:
    """The ``policy:`` node of airlock.yaml (``default`` and ``rules``); None: defaults.

    ``key`` is the node's key path in messages ("" for a bare policy document).
    """
    reader = FieldReader(path)
    prefix = f"{key}." if key else ""
    default: Verdict | None = None
    rules: list[Rule] = []
    sites: list[tuple[str, str, str]] = []
    try:
        if not is_null(node):
            assert node is not None
            if not isinstance(node, yaml.MappingNode):
                raise reader.fail(node, key or "(top level)", "expected a mapping with default and rules")
            for name, key_node, value in reader.items(node, key):
                if name == "default":
                    default = reader.verdict(value, f"{prefix}default")
                elif name == "rules":
                    rules, sites = _rules(reader, value, f"{prefix}rules")
                else:
                    raise reader.fail(
                        key_node, f"{prefix}{name}", f"unknown key (known: {', '.join(_MAIN_KEYS)})", got=False
                    )
    except Invalid:
        pass
    if reader.errors:
        raise PolicyError(reader.errors)
    return PolicyFile(path, default, tuple(rules), tuple(reader.warnings), tuple(sites))


def _parse_dropin(root: yaml.Node | None, path: str) -> PolicyFile:
    reader = FieldReader(path)
    rules: list[Rule] = []
    sites: list[tuple[str, str, str]] = []
    try:
        if not is_null(root):
            assert root is not None
            if not isinstance(root, yaml.MappingNode):
                raise reader.fail(root, "(top level)", "a policy.d file is a mapping holding rules: only")
            for name, key_node, value in reader.items(root, ""):
                if name == "rules":
                    rules, sites = _rules(reader, value, "rules")
                elif name in ("default", "policy"):
                    raise reader.fail(
                        key_node,
                        name,
                        "not allowed here: a policy.d file holds rules: only (default belongs under policy: in "
                        "airlock.yaml)",
                        got=False,
                    )
                else:
                    raise reader.fail(key_node, name, "unknown key (a policy.d file holds rules: only)", got=False)
    except Invalid:
        pass
    if reader.errors:
        raise PolicyError(reader.errors)
    return PolicyFile(path, None, tuple(rules), tuple(reader.warnings), tuple(sites))


def parse_policy_text(text: str, path: str, *, main: bool) -> PolicyFile:
    """Parse one file: the main policy (``main``) or a policy.d file (rules only).

    The main policy is a whole airlock.yaml (its ``policy:`` node is used, the
    other sections are config's business) or, for tests and tools, a bare
    policy document holding only ``default`` and ``rules``.
    """
    root = _compose(text, path)
    if not main:
        return _parse_dropin(root, path)
    if is_null(root):
        return PolicyFile(path, None, ())
    assert root is not None
    if not isinstance(root, yaml.MappingNode):
        raise PolicyError(
            [f"{where(path, root)}: (top level): the file must be a mapping of sections{yamlnodes.got(root)}"]
        )
    keys = {k.value: (k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode)}
    if "policy" in keys:
        return parse_policy_node(keys["policy"][1], path)
    if keys and set(keys) <= set(_MAIN_KEYS) and len(keys) == len(root.value):
        return parse_policy_node(root, path, key="")
    for stray in _MAIN_KEYS:
        if stray in keys:
            raise PolicyError([f"{where(path, keys[stray][0])}: {stray}: belongs under policy: in airlock.yaml"])
    return PolicyFile(path, None, ())
