"""Exact argument and path matching for policy rules: no globs, no regex.

A command pattern is a tuple of strings.  Its head is a canonical absolute
path; each later element is one of

* ``{name}``: exactly one argument that `placeholder_accepts`;
* ``{name:file}``: exactly one file name (`file_name_accepts`: a plain
  argument without ``/``, not ``.`` or ``..``), relative to the job's
  directory (a rule's ``cwd`` pins it);
* ``DIR/{name:file}``: exactly one file name in the directory ``DIR`` (an
  absolute, normalised path), written ``DIR/NAME``;
* ``...`` (only as the last element): any remaining arguments, even none;
* anything else: exactly one argument, compared as a plain string.

The rules are this small on purpose: every pattern can be read aloud, and what
it matches is what it says.  Sudoers' globs (``*`` crossing spaces, matching
``-`` options) are the history this avoids.

File path patterns are absolute, normalised paths; a trailing ``/...`` names a
whole subtree (the directory itself included).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from airlock.common import fileop_spec
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import canonical

REST = "..."
NONE = "none"  # a rule's ``cwd: none`` / ``stdin: none`` (issue 45): the request gives none

# Placeholder names are identifiers so that ``{pkg-name}`` or ``{}`` (likely a
# typo or a find(1) argument) is an error rather than a silent literal.
_PLACEHOLDER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Characters a placeholder may never carry: anything a shell would interpret
# (if the argument ever reaches one, e.g. through ``sh -c`` or ssh), plus
# characters that have no business in a package, unit or file name.
SHELL_METACHARACTERS = frozenset(";&|<>$`\\\"'*?[](){}!#~\n")

# Tools of the file verbs (issue 10); a rule's ``files:`` may only name these.
FILE_TOOLS = fileop_spec.FILE_TOOLS

_GLOB_CHARACTERS = frozenset("*?[")


def is_placeholder(element: str) -> bool:
    """Whether a pattern element is written as a placeholder (valid or not)."""
    return len(element) >= 2 and element.startswith("{") and element.endswith("}")


def placeholder_accepts(arg: str) -> bool:
    """Whether ``{name}`` may stand for ``arg``.

    Refused: empty strings, options (``-o``, ``--config=…``: option injection
    is how an "install a package" rule becomes "run a hook"), whitespace and
    unprintable characters, shell metacharacters and ``..`` path segments.
    """
    if not arg or arg.startswith("-"):
        return False
    for char in arg:
        if char in SHELL_METACHARACTERS or char.isspace() or not char.isprintable():
            return False
    return ".." not in arg.split("/")


# The typed placeholder (issue 45): one file name, alone or in a fixed directory.
FILE_TYPE = ":file}"


def file_name_accepts(arg: str) -> bool:
    """Whether ``{name:file}`` may stand for ``arg``: a plain argument naming one file, no directory."""
    return placeholder_accepts(arg) and "/" not in arg and arg not in (".", "..")


def _typed_problem(element: str) -> str | None:
    """Why a ``{name:TYPE}`` or ``DIR/{name:file}`` element is malformed, or None (also None: not one)."""
    brace = element.rfind("{")
    if not element.endswith("}") or brace < 0 or ":" not in element[brace:]:
        return None
    if brace > 0 and not element.endswith(FILE_TYPE):
        return None  # a literal that happens to end in braces (a format string)
    name, _, kind = element[brace + 1 : -1].partition(":")
    if not _PLACEHOLDER_NAME.match(name):
        return "bad placeholder name: use {name} with letters, digits and _ (not starting with a digit)"
    if kind != "file":
        return f"unknown placeholder type {kind!r} (known: file)"
    if brace == 0:
        return None
    directory = element[: brace - 1]
    if element[brace - 1] != "/" or not directory.startswith("/") or path_pattern_problem(directory) is not None:
        return "the directory before {name:file} must be an absolute, normalised path (DIR/{name:file})"
    if REST in directory.split("/"):
        return "the directory before {name:file} must be an absolute, normalised path (DIR/{name:file})"
    return None


def _typed(element: str) -> tuple[str, str] | None:
    """(directory, name) of a ``{name:file}`` (directory "") or ``DIR/{name:file}`` element, else None."""
    if not element.endswith(FILE_TYPE):
        return None
    brace = element.rfind("{")
    if brace < 0 or _typed_problem(element) is not None:
        return None
    return element[: max(brace - 1, 0)], element[brace + 1 : -len(FILE_TYPE)]


def pattern_problem(pattern: Sequence[str]) -> tuple[int, str] | None:
    """The first problem of a command pattern as (element index, message), or None."""
    if not pattern:
        return 0, "empty command"
    if not pattern[0].startswith("/"):
        return 0, "the first element must be an absolute path"
    last = len(pattern) - 1
    for index, element in enumerate(pattern[1:], start=1):
        if element == REST and index != last:
            return index, '"..." is only allowed as the last element'
        typed = _typed_problem(element)
        if typed is not None:
            return index, typed
        if is_placeholder(element) and ":" not in element and not _PLACEHOLDER_NAME.match(element[1:-1]):
            return index, "bad placeholder name: use {name} with letters, digits and _ (not starting with a digit)"
    return None


def canonical_head(path: str) -> str:
    """The canonical form of a pattern's binary, computed once at load time.

    Symlinks are resolved as far as the path exists (``/bin/sh`` becomes
    ``/usr/bin/dash`` on Debian, ``/bin/x`` becomes ``/usr/bin/x`` on a merged
    /usr even before x is installed); the rest is kept, normalised.  Requests
    are canonicalised the same way, so both sides meet on one spelling.

    A path that changes while it is resolved (a symlink replaced mid-walk) is
    refused with ``invalid_arguments``, never an internal error.
    """
    real = canonical(path)
    if real is None:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS, f"{path!r} changed while it was being resolved; try again", {"path": path}
        )
    return real


def match_args(pattern: Sequence[str], args: Sequence[str]) -> bool:
    """Whether ``args`` (argv without argv[0]) match ``pattern`` (without its head)."""
    for index, element in enumerate(pattern):
        if element == REST and index == len(pattern) - 1:
            return True
        if index >= len(args):
            return False
        arg = args[index]
        if element.endswith(FILE_TYPE) and (typed := _typed(element)) is not None:
            directory = typed[0]
            if directory and not arg.startswith(directory + "/"):
                return False
            if not file_name_accepts(arg[len(directory) + 1 :] if directory else arg):
                return False
        elif is_placeholder(element):
            if not placeholder_accepts(arg):
                return False
        elif arg != element:
            return False
    return len(args) == len(pattern)


def path_pattern_problem(pattern: str) -> str | None:
    """Why a file path pattern is invalid, or None."""
    if not pattern.startswith("/"):
        return "must be an absolute path"
    segments = pattern.split("/")[1:]
    if pattern == "/":
        return None
    for index, segment in enumerate(segments):
        if segment == REST:
            if index != len(segments) - 1:
                return '"..." is only allowed as the last path segment'
            continue
        if segment in ("", ".", ".."):
            return "must be a normalised path (no empty, . or .. segments, no trailing /)"
        if _GLOB_CHARACTERS & set(segment):
            return "no globs: name a file, or a subtree with a trailing /..."
    return None


def canonical_path_pattern(pattern: str) -> tuple[str, bool]:
    """(canonical base path, whether it names a subtree) for a valid pattern."""
    if pattern == "/" + REST:
        return "/", True
    if pattern.endswith("/" + REST):
        return canonical_head(pattern[: -len(REST) - 1]), True
    return canonical_head(pattern), False


def match_path(base: str, subtree: bool, path: str) -> bool:
    """Whether a canonical path is ``base`` or, for a subtree, anything under it."""
    if path == base:
        return True
    if not subtree:
        return False
    return path.startswith(base if base.endswith("/") else base + "/")


@dataclass(frozen=True, slots=True)
class FileGrant:
    """One entry of a rule's ``files:``: these tools on these paths.

    ``paths`` are canonical: a file, or ``base/...`` for base and everything under it.
    """

    tools: frozenset[str]
    paths: tuple[str, ...]

    def matches(self, tool: str, path: str) -> bool:
        if tool not in self.tools:
            return False
        for pattern in self.paths:
            subtree = pattern.endswith("/" + REST)
            base = (pattern[: -len(REST) - 1] or "/") if subtree else pattern
            if match_path(base, subtree, path):
                return True
        return False
