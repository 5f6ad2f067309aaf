"""A policy rule's fields, each read from its YAML node with every problem located.

`FieldReader` reads one file's nodes: the primitives (keys, strings,
verdicts, names) and each field of a rule (``commands``, ``files``,
``approvals``/``approvers``/``reason``, ``reviewer``, ``sandbox``,
``credentials``), collecting errors and warnings as ``path:line:col: key:
message``.  `airlock.approval.policyfile` puts the fields together into rules
and files.  Pure apart from looking at the binaries and credential files a
rule names, and the accounts it names (a warning when missing).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import stat
from collections.abc import Mapping
from typing import Any, cast

import yaml

from airlock.approval import match
from airlock.approval.match import FileGrant
from airlock.approval.quorum import Approvers
from airlock.approval.rules import VERDICTS, Verdict
from airlock.common import binary, sandbox, yamlnodes
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import resolve_executable
from airlock.common.yamlnodes import INT, STR, where

MAX_APPROVALS = 16
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Invalid(Exception):
    """One problem inside a rule; the rule is skipped and parsing goes on."""


class FieldReader:
    """Turns one file's nodes into rule fields, collecting every error and warning it finds."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def fail(self, node: yaml.Node, key: str, message: str, *, got: bool = True) -> Invalid:
        self.errors.append(f"{where(self.path, node)}: {key}: {message}{yamlnodes.got(node) if got else ''}")
        return Invalid()

    def items(self, node: yaml.MappingNode, key: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        out: list[tuple[str, yaml.Node, yaml.Node]] = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != STR:
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
        if not isinstance(node, yaml.ScalarNode) or node.tag != STR:
            raise self.fail(node, key, f"expected {what}")
        return str(node.value)

    def verdict(self, node: yaml.Node, key: str) -> Verdict:
        if not isinstance(node, yaml.ScalarNode) or node.tag != STR or node.value not in VERDICTS:
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
            tags = (STR, INT) if numbers else (STR,)
            if not isinstance(item, yaml.ScalarNode) or item.tag not in tags:
                raise self.fail(item, f"{key}[{index}]", f"expected {each}")
            value = str(item.value)
            # YAML 1.1 reads 010 as 8 and 0x10 as 16: a uid must be written plainly.
            if item.tag == INT and not (value.isdigit() and (value == "0" or value[0] != "0")):
                raise self.fail(item, f"{key}[{index}]", "a uid is a plain decimal number")
            if not value or any(c.isspace() or not c.isprintable() for c in value):
                raise self.fail(item, f"{key}[{index}]", "must be a non-empty name without spaces")
            missing = _missing_account(key, value)
            if missing is not None:
                # Not an error (the account may come later: an LDAP outage, a user not yet made),
                # but never silent: the rule cannot match it today (issue 32).
                self.warnings.append(f"{where(self.path, item)}: {key}[{index}]: {missing}")
            values.add(value)
        return frozenset(values)

    def reviewer(
        self, values: Mapping[str, yaml.Node], key: str, decision: Verdict, approvals: int, approvers: Approvers | None
    ) -> str | None:
        """A rule's ``reviewer:`` (issue 34): what the reviewer may do with its asks."""
        if "reviewer" not in values:
            return None
        node = values["reviewer"]
        if not isinstance(node, yaml.ScalarNode) or node.tag != STR or node.value not in ("allow", "deny", "advise"):
            raise self.fail(node, f"{key}.reviewer", "must be allow, deny or advise")
        if decision != "ask":
            raise self.fail(node, f"{key}.reviewer", "applies only to a rule with decision: ask", got=False)
        if node.value != "advise" and (approvals > 1 or approvers is not None):
            raise self.fail(
                node,
                f"{key}.reviewer",
                "a quorum rule (approvals, approvers) is decided by people only: the reviewer may only advise",
            )
        return str(node.value)

    def quorum(
        self, values: Mapping[str, yaml.Node], key: str, decision: Verdict
    ) -> tuple[int, Approvers | None, bool]:
        """A rule's ``approvals``, ``approvers`` and ``reason`` (issue 18)."""
        approvals, approvers, reason_required = 1, None, False
        for name in ("approvals", "approvers"):
            if name in values and decision != "ask":
                raise self.fail(values[name], f"{key}.{name}", "applies only to a rule with decision: ask", got=False)
        if "approvals" in values:
            node = values["approvals"]
            if (
                not isinstance(node, yaml.ScalarNode)
                or node.tag != INT
                or not node.value.isdigit()
                or not 1 <= int(node.value) <= MAX_APPROVALS
            ):
                raise self.fail(node, f"{key}.approvals", f"expected a number of approvers from 1 to {MAX_APPROVALS}")
            approvals = int(node.value)
        if "approvers" in values:
            node = values["approvers"]
            if not isinstance(node, yaml.MappingNode):
                raise self.fail(node, f"{key}.approvers", "expected a mapping with users, groups and/or principals")
            found: dict[str, frozenset[str]] = {}
            for item, item_key, item_value in self.items(node, f"{key}.approvers"):
                if item not in ("users", "groups", "principals"):
                    raise self.fail(
                        item_key, f"{key}.approvers.{item}", "unknown key (known: groups, principals, users)", got=False
                    )
                found[item] = self.names(item_value, f"{key}.approvers.{item}", numbers=item == "users")
            if not found:
                raise self.fail(node, f"{key}.approvers", "must name users, groups or principals")
            approvers = Approvers(**found)
        if "reason" in values:
            node = values["reason"]
            if not isinstance(node, yaml.ScalarNode) or node.tag != STR or node.value not in ("required", "optional"):
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
                raise self.fail(
                    key_node if name not in sandbox.KEYS else item,
                    f"{key}.{name}",
                    exc.message.split(": ", 1)[-1].rsplit(" (got ", 1)[0],
                ) from None
        return dict(value)

    def credentials(self, node: yaml.Node, key: str, privileged: bool | None) -> dict[str, str]:
        """A rule's credentials: ``{name: absolute path}``, each file root's alone (runner/credentials.py
        checks again, on an fd, before every job), on a rule for root jobs only."""
        if not isinstance(node, yaml.MappingNode) or not node.value:
            raise self.fail(node, key, "expected a mapping of credential names to absolute file paths")
        if privileged is not True:
            # Issue 51: an unprivileged job runs as the agent itself, and systemd's copy of the
            # value belongs to the job's uid: any other process of the agent could read it.
            raise self.fail(
                node,
                key,
                "apply only to a rule with privileged: true (an unprivileged job runs as the agent, "
                "who could then read the value)",
                got=False,
            )
        out: dict[str, str] = {}
        for name, key_node, value in self.items(node, key):
            if not CREDENTIAL_NAME.fullmatch(name):
                raise self.fail(key_node, f"{key}.{name}", "a credential name is 1 to 64 of A-Z a-z 0-9 _ . -")
            path = self.string(value, f"{key}.{name}", "an absolute file path")
            if not path.startswith("/") or "\0" in path or ":" in path or os.path.normpath(path) != path:
                raise self.fail(value, f"{key}.{name}", "must be an absolute, normalised path without ':'")
            problem = _credential_problem(path)
            if problem is not None:
                raise self.fail(value, f"{key}.{name}", problem)
            out[name] = path
        return out

    def warn_untrusted(self, node: yaml.Node, key: str, commands: tuple[tuple[str, ...], ...]) -> None:
        """A root-only rule for a binary that is not root's alone could never run (issue 14)."""
        for index, command in enumerate(commands):
            if not _executable(command[0]):
                continue  # already warned: not installed
            try:
                fd, _ = binary.open_binary(command[0], trusted=True)
                os.close(fd)
            except AirlockError as exc:
                if exc.code is ErrorCode.UNSAFE_BINARY:
                    self.warnings.append(f"{where(self.path, node)}: {key}[{index}]: {exc.message} (unsafe_binary)")

    def cwd(self, node: yaml.Node, key: str) -> str:
        """A rule's ``cwd`` (issue 45): ``none``, or an absolute normalised directory, kept canonical."""
        value = self.string(node, key, "none or an absolute directory")
        if value == "none":
            return value
        problem = match.path_pattern_problem(value)
        if problem is not None or match.REST in value.split("/"):
            raise self.fail(node, key, "must be none or an absolute, normalised directory (no ..., no . or ..)")
        try:
            return match.canonical_head(value)
        except AirlockError as exc:
            raise self.fail(node, key, exc.message) from None

    def stdin(self, node: yaml.Node, key: str) -> str:
        """A rule's ``stdin`` (issue 45): ``none``, or ``sha256:`` and 64 lowercase hex digits."""
        value = self.string(node, key, "none or sha256:HEX")
        digest = value.removeprefix("sha256:")
        if value != "none" and not (value.startswith("sha256:") and _SHA256.fullmatch(digest)):
            raise self.fail(node, key, "must be none or sha256: and 64 lowercase hex digits")
        return value

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
            if not isinstance(item, yaml.ScalarNode) or item.tag != STR:
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
            self.warnings.append(f"{where(self.path, node.value[0])}: {key}[0]: no executable at {head} (yet)")
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
            for path_index, path_node in enumerate(self.list_(values["paths"], f"{entry}.paths")):
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

    def list_(self, node: yaml.Node, key: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, key, "expected a non-empty list")
        return cast(list[yaml.Node], node.value)


CREDENTIAL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _credential_problem(path: str) -> str | None:
    """Why a credential file is unsafe as approval can see it (lstat), or None; the runner checks again."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (name the file itself)"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != 0:
        return f"is owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others than root (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _executable(path: str) -> bool:
    # The same test resolve_executable applies to a request's binary.
    return resolve_executable(path, "") == path


def _missing_account(key: str, value: str) -> str | None:
    """Why a rule's user or group name matches nobody on this host, or None if it exists."""
    field = key.rsplit(".", 1)[-1]
    if field == "users":
        if value.isdigit():
            return None  # a uid matches whoever has it, now or later
        try:
            pwd.getpwnam(value)
        except KeyError:
            return f"no user {value!r} on this host: the rule matches nobody by that name"
    elif field == "groups":
        try:
            grp.getgrnam(value)
        except KeyError:
            return f"no group {value!r} on this host: the rule matches nobody through it"
    return None
