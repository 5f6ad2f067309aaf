"""The policy engine: exact, order-independent, explainable decisions.

Pure: no sockets, no asyncio.  The filesystem is read only to load policy
files and to resolve binaries (the same `resolve_executable` the runner uses).

A policy is the ``policy:`` node of airlock.yaml (``default`` and ``rules``)
plus ``policy.d/*.yaml`` (``rules`` only), read in name order.  A policy with
any error is rejected whole: `PolicyError` lists every problem found, each as
``path:line:col: key.path: message (got 'value')``.

Deciding never depends on order: for each stage the most restrictive matching
rule wins (deny > ask > allow), the pipeline takes its most restrictive stage,
and ties are broken by rule name.  docs/policy.md is the reference.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from airlock.approval import match
from airlock.approval.match import FileGrant
from airlock.approval.quorum import Approvers, Requirement, join
from airlock.common import binary, sandbox
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import default_path, resolve_executable

Verdict = Literal["allow", "ask", "deny"]
VERDICTS: tuple[Verdict, ...] = ("allow", "ask", "deny")
_RANK: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}

# Pseudo-rule names a decision can carry; no real rule may take them.
DEFAULT_RULE = "default"  # no rule matched: the policy's default decided
UNRESOLVED_RULE = "unresolved"  # argv[0] is no executable: denied, it could not run anyway
_RESERVED = frozenset({DEFAULT_RULE, UNRESOLVED_RULE})

Resolver = Callable[[str, str], "str | None"]

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_RULE_KEYS = ("approvals", "approvers", "commands", "decision", "description", "files", "groups", "name", "privileged",
              "reason", "sandbox", "sessions", "users")
MAX_APPROVALS = 16
_MAIN_KEYS = ("default", "rules")


class PolicyError(Exception):
    """A rejected policy; ``errors`` holds one rendered line per problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        super().__init__("\n".join(self.errors))


# --- the parsed policy -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subject:
    """Who asks.  ``target_uid`` is whose PATH resolves argv[0]: 0 when privileged, else the peer's."""

    uid: int
    user: str
    groups: frozenset[str]  # group names, primary and supplementary
    session: str | None
    privileged: bool
    target_uid: int


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    decision: Verdict
    users: frozenset[str]  # names or decimal uids; empty: anyone
    groups: frozenset[str]  # empty: any
    sessions: frozenset[str]  # empty: any, even none
    privileged: bool | None  # None: either
    commands: tuple[tuple[str, ...], ...] | None  # heads canonical; None: any command
    source: str  # path:line
    files: tuple[FileGrant, ...] | None = None  # None: any file operation (see `targets_commands`)
    description: str = ""
    # Unit settings for this rule's jobs (common/sandbox.py); None: a full job, as with sudo.
    sandbox: Mapping[str, Any] | None = field(default=None, compare=False)
    # Issue 18: distinct approvers an ``ask`` needs, who counts, and whether the agent must say why.
    approvals: int = 1
    approvers: Approvers | None = None
    reason_required: bool = False

    def __post_init__(self) -> None:
        # Rules built in code (tests, tools) get the same guarantees as parsed
        # ones: valid patterns, and heads canonical like the requests they meet.
        if self.decision not in VERDICTS:
            raise ValueError(f"rule {self.name!r}: decision must be one of allow, ask, deny (got {self.decision!r})")
        if self.commands is not None:
            for pattern in self.commands:
                problem = match.pattern_problem(pattern)
                if problem is not None:
                    raise ValueError(f"rule {self.name!r}: {list(pattern)!r}[{problem[0]}]: {problem[1]}")
            canonical = tuple((match.canonical_head(p[0]), *p[1:]) for p in self.commands)
            object.__setattr__(self, "commands", canonical)

    def applies_to(self, subject: Subject) -> bool:
        """Whether every subject condition of this rule holds."""
        if self.users and subject.user not in self.users and str(subject.uid) not in self.users:
            return False
        if self.groups and not (self.groups & subject.groups):
            return False
        if self.sessions and (subject.session is None or subject.session not in self.sessions):
            return False
        return self.privileged is None or self.privileged == subject.privileged

    # A rule naming only ``files:`` must not become "any command" (nor one naming
    # only ``commands:`` "any file"): absent means any only when both are absent.
    @property
    def targets_commands(self) -> bool:
        return self.commands is not None or self.files is None

    @property
    def targets_files(self) -> bool:
        return self.files is not None or self.commands is None

    def matches_command(self, resolved: str | None, args: Sequence[str]) -> bool:
        if not self.targets_commands:
            return False
        if self.commands is None:
            return True
        if resolved is None:
            return False
        return any(p[0] == resolved and match.match_args(p[1:], args) for p in self.commands)

    def matches_file(self, tool: str, path: str) -> bool:
        """Whether this rule covers ``tool`` on a canonical absolute ``path``."""
        if not self.targets_files:
            return False
        return self.files is None or any(grant.matches(tool, path) for grant in self.files)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "decision": self.decision, "source": self.source}
        for key in ("users", "groups", "sessions"):
            value: frozenset[str] = getattr(self, key)
            if value:
                out[key] = sorted(value)
        if self.privileged is not None:
            out["privileged"] = self.privileged
        if self.commands is not None:
            out["commands"] = [list(p) for p in self.commands]
        if self.files is not None:
            out["files"] = [{"tools": sorted(g.tools), "paths": list(g.paths)} for g in self.files]
        if self.description:
            out["description"] = self.description
        if self.sandbox is not None:
            out["sandbox"] = dict(self.sandbox)
        if self.approvals != 1:
            out["approvals"] = self.approvals
        if self.approvers is not None:
            out["approvers"] = self.approvers.to_dict()
        if self.reason_required:
            out["reason"] = "required"
        return out


@dataclass(frozen=True, slots=True)
class StageDecision:
    argv: tuple[str, ...]
    resolved: str | None  # the canonical binary the runner must execute
    decision: Verdict
    rule: str  # the deciding rule, DEFAULT_RULE or UNRESOLVED_RULE
    matched: tuple[str, ...] = ()  # every rule that matched, by name
    sandbox: Mapping[str, Any] | None = field(default=None, compare=False)  # the deciding rule's; None: none

    def to_dict(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "resolved": self.resolved,
            "decision": self.decision,
            "rule": self.rule,
            "matched": list(self.matched),
            "sandbox": dict(self.sandbox) if self.sandbox is not None else None,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    decision: Verdict
    rule: str
    stages: tuple[StageDecision, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "rule": self.rule, "stages": [s.to_dict() for s in self.stages]}


def _pseudo_rank(name: str) -> int:
    # Among equally restrictive stages, name a real rule before a pseudo-rule:
    # "denied by no-dd" tells the agent more than "denied by default".
    return 2 if name == DEFAULT_RULE else 1 if name == UNRESOLVED_RULE else 0


def _decide_one(rules: Iterable[Rule], default: Verdict, unmatched: str) -> tuple[Verdict, str, tuple[str, ...]]:
    matched = sorted(rules, key=lambda r: (-_RANK[r.decision], r.name))
    if not matched:
        return default, unmatched, ()
    return matched[0].decision, matched[0].name, tuple(sorted(r.name for r in matched))


def _combine(stages: tuple[StageDecision, ...]) -> Decision:
    top = min(stages, key=lambda s: (-_RANK[s.decision], _pseudo_rank(s.rule), s.rule))
    return Decision(top.decision, top.rule, stages)


@dataclass(frozen=True, slots=True)
class Policy:
    default: Verdict
    rules: tuple[Rule, ...]
    sources: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # e.g. a rule for a binary that is not installed

    def decide(
        self, subject: Subject, stages: Sequence[Sequence[str]], *, resolver: Resolver | None = None
    ) -> Decision:
        """Decide a pipeline (one stage for a plain command).

        ``resolver`` defaults to `resolve_executable`; tests may pass another.
        """
        if not stages or any(not stage for stage in stages):
            raise ValueError("a pipeline needs at least one stage, and every stage an argv[0]")
        resolve = resolver or resolve_executable
        search_path = default_path(subject.target_uid)
        applicable = [r for r in self.rules if r.applies_to(subject)]
        out = []
        for stage in stages:
            argv = tuple(stage)
            resolved = resolve(argv[0], search_path)
            hits = [r for r in applicable if r.matches_command(resolved, argv[1:])]
            # An unresolvable argv[0] can match only rules without commands; if
            # none does it is denied, whatever the default: it cannot run, and
            # nothing that appears there later was ever approved.
            default: Verdict = self.default if resolved is not None else "deny"
            unmatched = DEFAULT_RULE if resolved is not None else UNRESOLVED_RULE
            verdict, rule, names = _decide_one(hits, default, unmatched)
            confined = next((r.sandbox for r in hits if r.name == rule), None)
            out.append(StageDecision(argv, resolved, verdict, rule, names, confined))
        return _combine(tuple(out))

    def decide_file(self, subject: Subject, tool: str, path: str) -> Decision:
        """Decide one file operation (issue 10): ``tool`` on ``path``.

        The path is canonicalised (symlinks resolved as far as they exist) so a
        link inside an allowed tree cannot reach outside it.  A relative path
        or an unknown tool is denied as UNRESOLVED_RULE before any rule is
        consulted: there is no file it could safely mean.
        """
        if tool not in match.FILE_TOOLS or not path.startswith("/") or "\0" in path:
            stage = StageDecision((tool, path), None, "deny", UNRESOLVED_RULE)
            return Decision("deny", UNRESOLVED_RULE, (stage,))
        try:
            canonical = match.canonical_head(path)
        except AirlockError:
            # A link along the path flipped while it was resolved (readlink of what lstat
            # saw as a link fails with EINVAL): no stable file to decide on, so denied.
            stage = StageDecision((tool, path), None, "deny", UNRESOLVED_RULE)
            return Decision("deny", UNRESOLVED_RULE, (stage,))
        hits = [r for r in self.rules if r.applies_to(subject) and r.matches_file(tool, canonical)]
        verdict, rule, names = _decide_one(hits, self.default, DEFAULT_RULE)
        stage = StageDecision((tool, path), canonical, verdict, rule, names)
        return Decision(verdict, rule, (stage,))

    def requirement(self, decision: Decision) -> Requirement:
        """What a request needs beyond the verdict: joined over every stage's deciding rule (quorum.py)."""
        by_name = {r.name: r for r in self.rules}
        deciding = [by_name[s.rule] for s in decision.stages if s.rule in by_name]
        return join((r.approvals, r.approvers, r.reason_required) for r in deciding)

    def to_dict(self) -> dict[str, Any]:
        return {
            "default": self.default,
            "rules": [r.to_dict() for r in sorted(self.rules, key=lambda r: r.name)],
            "sources": list(self.sources),
        }


# --- parsing ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """One parsed file (or the policy: node of airlock.yaml), before assembly."""

    path: str
    default: Verdict | None  # only airlock.yaml's policy: node may set it
    rules: tuple[Rule, ...]
    warnings: tuple[str, ...] = ()
    # (name, location of the name node, key path of the rule): for duplicate errors.
    name_sites: tuple[tuple[str, str, str], ...] = field(default=(), compare=False, repr=False)


class _Invalid(Exception):
    """One problem inside a rule; the rule is skipped and parsing goes on."""


def _where(path: str, node: yaml.Node) -> str:
    mark = node.start_mark
    return f"{path}:{mark.line + 1}:{mark.column + 1}"


def _got(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return f" (got {node.value!r})" if node.tag != _NULL else " (got null)"
    if isinstance(node, yaml.SequenceNode):
        return " (got a list)"
    return " (got a mapping)"


def _is_null(node: yaml.Node | None) -> bool:
    return node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL)


class _Reader:
    """Turns one file's nodes into rules, collecting every error it finds."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def fail(self, node: yaml.Node, key: str, message: str, *, got: bool = True) -> _Invalid:
        self.errors.append(f"{_where(self.path, node)}: {key}: {message}{_got(node) if got else ''}")
        return _Invalid()

    def items(self, node: yaml.MappingNode, key: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        out: list[tuple[str, yaml.Node, yaml.Node]] = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                raise self.fail(
                    key_node, key or "(top level)", "keys must be strings (YAML merge keys are not supported)"
                )
            name = key_node.value
            full = f"{key}.{name}" if key else name
            if name in seen:
                raise self.fail(key_node, full, "duplicate key")
            seen.add(name)
            out.append((name, key_node, value_node))
        return out

    def string(self, node: yaml.Node, key: str, what: str = "a string") -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _STR:
            raise self.fail(node, key, f"expected {what}")
        return str(node.value)

    def verdict(self, node: yaml.Node, key: str) -> Verdict:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _STR or node.value not in VERDICTS:
            raise self.fail(node, key, "must be one of allow, ask, deny")
        return cast(Verdict, node.value)

    def names(self, node: yaml.Node, key: str, *, numbers: bool) -> frozenset[str]:
        what, each = (
            ("a list of user names or uids", "a user name or uid") if numbers else ("a list of names", "a name")
        )
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, f"expected {what}")
        if not node.value:
            raise self.fail(node, key, f"must not be empty (leave {key.rsplit('.', 1)[-1]} out to mean any)")
        values = set()
        for index, item in enumerate(node.value):
            tags = (_STR, _INT) if numbers else (_STR,)
            if not isinstance(item, yaml.ScalarNode) or item.tag not in tags:
                raise self.fail(item, f"{key}[{index}]", f"expected {each}")
            value = str(item.value)
            # YAML 1.1 reads 010 as 8 and 0x10 as 16: a uid must be written plainly.
            if item.tag == _INT and not (value.isdigit() and (value == "0" or value[0] != "0")):
                raise self.fail(item, f"{key}[{index}]", "a uid is a plain decimal number")
            if not value or any(c.isspace() or not c.isprintable() for c in value):
                raise self.fail(item, f"{key}[{index}]", "must be a non-empty name without spaces")
            values.add(value)
        return frozenset(values)

    def rules(self, node: yaml.Node, key: str) -> tuple[list[Rule], list[tuple[str, str, str]]]:
        if _is_null(node):
            return [], []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, "expected a list of rules")
        rules, sites = [], []
        for index, item in enumerate(node.value):
            try:
                rule, site = self.rule(item, f"{key}[{index}]")
            except _Invalid:
                continue
            rules.append(rule)
            sites.append(site)
        return rules, sites

    def rule(self, node: yaml.Node, key: str) -> tuple[Rule, tuple[str, str, str]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, "expected a rule (a mapping with name, decision, ...)")
        items = self.items(node, key)
        values = {name: value for name, _, value in items}
        # The name first, so every later message can say which rule it is about.
        if "name" not in values:
            raise self.fail(node, key, "missing name (every rule needs a unique name)", got=False)
        name_node = values["name"]
        name = self.string(name_node, f"{key}.name", "a rule name")
        if not name or any(c.isspace() or not c.isprintable() for c in name) or len(name) > 128:
            raise self.fail(name_node, f"{key}.name", "a rule name is 1 to 128 characters without spaces")
        if name in _RESERVED:
            raise self.fail(name_node, f"{key}.name", f"{name!r} is reserved for decisions no rule made")
        key = f"{key} ({name})"
        for item_name, key_node, _ in items:
            if item_name not in _RULE_KEYS:
                raise self.fail(
                    key_node, f"{key}.{item_name}", f"unknown key (known: {', '.join(_RULE_KEYS)})", got=False
                )
        if "decision" not in values:
            raise self.fail(node, key, "missing decision (allow, ask or deny)", got=False)
        decision = self.verdict(values["decision"], f"{key}.decision")

        def names(field_name: str, *, numbers: bool = False) -> frozenset[str]:
            if field_name not in values:
                return frozenset()
            return self.names(values[field_name], f"{key}.{field_name}", numbers=numbers)

        privileged: bool | None = None
        if "privileged" in values:
            flag = values["privileged"]
            if not isinstance(flag, yaml.ScalarNode) or flag.tag != _BOOL:
                raise self.fail(flag, f"{key}.privileged", "expected true or false (leave it out to mean either)")
            privileged = flag.value.lower() in ("true", "yes", "on")
        commands = self.commands(values["commands"], f"{key}.commands") if "commands" in values else None
        if commands and privileged and decision != "deny":
            self._warn_untrusted(values["commands"], f"{key}.commands", commands)
        files = self.files(values["files"], f"{key}.files") if "files" in values else None
        description = self.string(values["description"], f"{key}.description") if "description" in values else ""
        confined = self.sandbox(values["sandbox"], f"{key}.sandbox") if "sandbox" in values else None
        approvals, approvers, reason_required = self.quorum(values, key, decision)
        rule = Rule(
            name=name,
            decision=decision,
            users=names("users", numbers=True),
            groups=names("groups"),
            sessions=names("sessions"),
            privileged=privileged,
            commands=commands,
            source=f"{self.path}:{node.start_mark.line + 1}",
            files=files,
            description=description,
            sandbox=confined,
            approvals=approvals,
            approvers=approvers,
            reason_required=reason_required,
        )
        return rule, (name, _where(self.path, name_node), key)

    def quorum(self, values: Mapping[str, yaml.Node], key: str, decision: Verdict) -> tuple[int, Approvers | None, bool]:
        """A rule's ``approvals``, ``approvers`` and ``reason`` (issue 18)."""
        approvals, approvers, reason_required = 1, None, False
        for name in ("approvals", "approvers"):
            if name in values and decision != "ask":
                raise self.fail(values[name], f"{key}.{name}", "applies only to a rule with decision: ask", got=False)
        if "approvals" in values:
            node = values["approvals"]
            if not isinstance(node, yaml.ScalarNode) or node.tag != _INT or not node.value.isdigit() \
                    or not 1 <= int(node.value) <= MAX_APPROVALS:
                raise self.fail(node, f"{key}.approvals", f"expected a number of approvers from 1 to {MAX_APPROVALS}")
            approvals = int(node.value)
        if "approvers" in values:
            node = values["approvers"]
            if not isinstance(node, yaml.MappingNode):
                raise self.fail(node, f"{key}.approvers", "expected a mapping with users, groups and/or principals")
            found: dict[str, frozenset[str]] = {}
            for item, item_key, item_value in self.items(node, f"{key}.approvers"):
                if item not in ("users", "groups", "principals"):
                    raise self.fail(item_key, f"{key}.approvers.{item}", "unknown key (known: groups, principals, users)",
                                    got=False)
                found[item] = self.names(item_value, f"{key}.approvers.{item}", numbers=item == "users")
            if not found:
                raise self.fail(node, f"{key}.approvers", "must name users, groups or principals")
            approvers = Approvers(**found)
        if "reason" in values:
            node = values["reason"]
            if not isinstance(node, yaml.ScalarNode) or node.tag != _STR or node.value not in ("required", "optional"):
                raise self.fail(node, f"{key}.reason", "must be required or optional")
            reason_required = node.value == "required"
        return approvals, approvers, reason_required

    def sandbox(self, node: yaml.Node, key: str) -> dict[str, Any]:
        """A rule's sandbox: a mapping of the documented settings, each checked (common/sandbox.py)."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, f"expected a mapping of sandbox settings ({', '.join(sandbox.KEYS)})")
        value = yaml.safe_load(yaml.serialize(node))
        for name, key_node, item in self.items(node, key):
            try:
                sandbox.properties({name: value[name]}, key)
            except AirlockError as exc:
                raise self.fail(key_node if name not in sandbox.KEYS else item, f"{key}.{name}",
                                exc.message.split(": ", 1)[-1].rsplit(" (got ", 1)[0]) from None
        return dict(value)

    def _warn_untrusted(self, node: yaml.Node, key: str, commands: tuple[tuple[str, ...], ...]) -> None:
        """A root-only rule for a binary that is not root's alone could never run (issue 14)."""
        for index, command in enumerate(commands):
            if not _executable(command[0]):
                continue  # already warned: not installed
            try:
                fd, _ = binary.open_binary(command[0], trusted=True)
                os.close(fd)
            except AirlockError as exc:
                if exc.code is ErrorCode.UNSAFE_BINARY:
                    self.warnings.append(f"{_where(self.path, node)}: {key}[{index}]: {exc.message} (unsafe_binary)")

    def commands(self, node: yaml.Node, key: str) -> tuple[tuple[str, ...], ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, "expected a list of commands, each a list like [/usr/bin/apt-get, update]")
        if not node.value:
            raise self.fail(node, key, "must not be empty (leave commands out to mean any command)")
        out = []
        for index, item in enumerate(node.value):
            out.append(self.command(item, f"{key}[{index}]"))
        return tuple(out)

    def command(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, "expected a command as a list of strings, like [/usr/bin/apt-get, update]")
        elements = []
        for index, item in enumerate(node.value):
            # Only quoted or plain strings: YAML would turn 0755 into 493 and
            # yes into true behind the author's back.
            if not isinstance(item, yaml.ScalarNode) or item.tag != _STR:
                raise self.fail(item, f"{key}[{index}]", "expected a string (quote numbers and booleans)")
            elements.append(str(item.value))
        problem = match.pattern_problem(elements)
        if problem is not None:
            index, message = problem
            target = node.value[index] if node.value else node
            raise self.fail(target, f"{key}[{index}]" if node.value else key, message, got=bool(node.value))
        # Canonical like the requests it is compared with (/bin/sh -> /usr/bin/dash).
        try:
            head = match.canonical_head(elements[0])
        except AirlockError as exc:
            raise self.fail(node.value[0], f"{key}[0]", exc.message) from None
        if not _executable(head):
            self.warnings.append(f"{_where(self.path, node.value[0])}: {key}[0]: no executable at {head} (yet)")
        return (head, *elements[1:])

    def files(self, node: yaml.Node, key: str) -> tuple[FileGrant, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, key, "expected a non-empty list of {tools: [...], paths: [...]}")
        grants = []
        for index, item in enumerate(node.value):
            entry = f"{key}[{index}]"
            if not isinstance(item, yaml.MappingNode):
                raise self.fail(item, entry, "expected a mapping with tools and paths")
            values: dict[str, yaml.Node] = {}
            for name, key_node, value_node in self.items(item, entry):
                if name not in ("tools", "paths"):
                    raise self.fail(key_node, f"{entry}.{name}", "unknown key (known: paths, tools)", got=False)
                values[name] = value_node
            for required in ("tools", "paths"):
                if required not in values:
                    raise self.fail(item, entry, f"missing {required}", got=False)
            tools = self.names(values["tools"], f"{entry}.tools", numbers=False)
            for tool_index, tool_node in enumerate(cast(list[yaml.Node], values["tools"].value)):
                if tool_node.value not in match.FILE_TOOLS:
                    raise self.fail(
                        tool_node,
                        f"{entry}.tools[{tool_index}]",
                        f"unknown tool (known: {', '.join(sorted(match.FILE_TOOLS))})",
                    )
            paths = []
            for path_index, path_node in enumerate(self._list(values["paths"], f"{entry}.paths")):
                value = self.string(path_node, f"{entry}.paths[{path_index}]")
                problem = match.path_pattern_problem(value)
                if problem is not None:
                    raise self.fail(path_node, f"{entry}.paths[{path_index}]", problem)
                try:
                    base, subtree = match.canonical_path_pattern(value)
                except AirlockError as exc:
                    raise self.fail(path_node, f"{entry}.paths[{path_index}]", exc.message) from None
                paths.append(f"{base.rstrip('/')}/{match.REST}" if subtree else base)
            grants.append(FileGrant(tools, tuple(paths)))
        return tuple(grants)

    def _list(self, node: yaml.Node, key: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, key, "expected a non-empty list")
        return cast(list[yaml.Node], node.value)


def _executable(path: str) -> bool:
    # The same test resolve_executable applies to a request's binary.
    return resolve_executable(path, "") == path


def _compose(text: str, path: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError([f"{where}: not valid YAML: {problem}"]) from None


def parse_policy_node(node: yaml.Node | None, path: str, *, key: str = "policy") -> PolicyFile:
    """The ``policy:`` node of airlock.yaml (``default`` and ``rules``); None: defaults.

    ``key`` is the node's key path in messages ("" for a bare policy document).
    """
    reader = _Reader(path)
    prefix = f"{key}." if key else ""
    default: Verdict | None = None
    rules: list[Rule] = []
    sites: list[tuple[str, str, str]] = []
    try:
        if not _is_null(node):
            assert node is not None
            if not isinstance(node, yaml.MappingNode):
                raise reader.fail(node, key or "(top level)", "expected a mapping with default and rules")
            for name, key_node, value in reader.items(node, key):
                if name == "default":
                    default = reader.verdict(value, f"{prefix}default")
                elif name == "rules":
                    rules, sites = reader.rules(value, f"{prefix}rules")
                else:
                    raise reader.fail(
                        key_node, f"{prefix}{name}", f"unknown key (known: {', '.join(_MAIN_KEYS)})", got=False
                    )
    except _Invalid:
        pass
    if reader.errors:
        raise PolicyError(reader.errors)
    return PolicyFile(path, default, tuple(rules), tuple(reader.warnings), tuple(sites))


def _parse_dropin(root: yaml.Node | None, path: str) -> PolicyFile:
    reader = _Reader(path)
    rules: list[Rule] = []
    sites: list[tuple[str, str, str]] = []
    try:
        if not _is_null(root):
            assert root is not None
            if not isinstance(root, yaml.MappingNode):
                raise reader.fail(root, "(top level)", "a policy.d file is a mapping holding rules: only")
            for name, key_node, value in reader.items(root, ""):
                if name == "rules":
                    rules, sites = reader.rules(value, "rules")
                elif name in ("default", "policy"):
                    raise reader.fail(
                        key_node,
                        name,
                        "not allowed here: a policy.d file holds rules: only (default belongs under policy: in airlock.yaml)",
                        got=False,
                    )
                else:
                    raise reader.fail(key_node, name, "unknown key (a policy.d file holds rules: only)", got=False)
    except _Invalid:
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
    if _is_null(root):
        return PolicyFile(path, None, ())
    assert root is not None
    if not isinstance(root, yaml.MappingNode):
        raise PolicyError([f"{_where(path, root)}: (top level): the file must be a mapping of sections{_got(root)}"])
    keys = {k.value: (k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode)}
    if "policy" in keys:
        return parse_policy_node(keys["policy"][1], path)
    if keys and set(keys) <= set(_MAIN_KEYS) and len(keys) == len(root.value):
        return parse_policy_node(root, path, key="")
    for stray in _MAIN_KEYS:
        if stray in keys:
            raise PolicyError([f"{_where(path, keys[stray][0])}: {stray}: belongs under policy: in airlock.yaml"])
    return PolicyFile(path, None, ())


def assemble(files: Sequence[PolicyFile]) -> Policy:
    """One policy from parsed files: rule names unique across all; default ``ask`` when unset."""
    errors: list[str] = []
    defaults = [f for f in files if f.default is not None]
    if len(defaults) > 1:
        errors.append(f"{defaults[1].path}: policy.default: set more than once (also in {defaults[0].path})")
    first: dict[str, str] = {}
    for policy_file in files:
        sources = {r.name: r.source for r in policy_file.rules}
        for name, where, key in policy_file.name_sites:
            if name in first:
                errors.append(
                    f"{where}: {key}.name: duplicate rule name, first defined at {first[name]} (got {name!r})"
                )
            else:
                first[name] = sources[name]
    if errors:
        raise PolicyError(errors)
    default: Verdict = defaults[0].default if defaults and defaults[0].default else "ask"
    rules = tuple(r for f in files for r in f.rules)
    warnings = tuple(w for f in files for w in f.warnings)
    return Policy(default, rules, tuple(f.path for f in files), warnings)


def load_policy(config: Config) -> Policy:
    """The whole policy: airlock.yaml's ``policy:`` node, then policy.d/*.yaml in name order.

    Every file is read and checked before anything is rejected, so one run
    reports every problem.  A missing policy.d directory is fine.
    """
    files: list[PolicyFile] = []
    errors: list[str] = []
    try:
        files.append(parse_policy_node(config.policy_node, config.source))
    except PolicyError as exc:
        errors.extend(exc.errors)
    for path in _dropin_paths(config.paths.policy_dir, errors):
        try:
            text = path.read_text(encoding="utf-8")
            files.append(parse_policy_text(text, str(path), main=False))
        except PolicyError as exc:
            errors.extend(exc.errors)
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{path}: cannot read: {exc}")
    try:
        policy = assemble(files)
    except PolicyError as exc:
        errors.extend(exc.errors)
    if errors:
        raise PolicyError(errors)
    return policy


def _dropin_paths(directory: Path, errors: list[str]) -> list[Path]:
    try:
        entries = sorted(directory.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        errors.append(f"{directory}: cannot read policy directory: {exc}")
        return []
    # Dot-files are editor and tool leftovers, never policy.
    return [p for p in entries if p.name.endswith(".yaml") and not p.name.startswith(".")]
