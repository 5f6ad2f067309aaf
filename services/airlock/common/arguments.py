"""A root job's path arguments: which argv elements may name files, and how a bound one reads.

At decide time approval asks the runner (root: it can see every file, and it
is the one that must find the same file later) to classify every argument of
a root job that may name a path (runner/arguments.py).  An argument someone
other than root can change is *changeable*: it is bound to the ticket by
identity and content (``bound["arguments"]``), flagged wherever a person
decides, never covered by a grant, allowed by a rule only with
``writable_arguments: allow``, and checked again by the runner just before
the job starts (``argument_changed``).  A *script* (the first path argument
of an interpreter, or a ``#!`` file handed to an exec wrapper) is more: the
runner hands the job the reviewed bytes themselves, in a sealed memfd.

This module is the pure half: which elements are candidates (`candidates`),
whether a request needs the runner's look at all (`worth_inspecting`), the
bound entries read back (`parse_bound`) and described for people
(`describe`).  docs/security.md says what is bound and what is only
re-checked.

Pure: no I/O.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from airlock.common.errors import AirlockError, ErrorCode

# Programs whose first path argument is code they run.
_INTERPRETER = re.compile(
    r"(?:sh|bash|dash|zsh|ksh|ksh93|mksh|posh|yash|csh|tcsh|fish|busybox"
    r"|python[0-9.]*|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|php[0-9.]*"
    r"|lua[0-9.]*|luajit|tclsh[0-9.]*|wish[0-9.]*|expect|Rscript|guile[0-9.]*)"
)
_SHELL = re.compile(r"(?:sh|bash|dash|zsh|ksh|ksh93|mksh|posh|yash|csh|tcsh|fish)")
# Options after which an interpreter runs code from argv, not from a file.
_COMMAND_OPTIONS = frozenset({"-c", "-e", "-E", "-m", "-r", "-p", "--eval", "--print", "--command"})
# Programs that execute their first path argument (a #! file there is a script too).
_WRAPPERS = frozenset({"env", "timeout", "nice", "nohup", "ionice", "chrt", "taskset", "setsid", "stdbuf", "xargs"})
MAX_CANDIDATES = 1024
KINDS = ("file", "directory", "other", "absent")


@dataclass(frozen=True, slots=True)
class Candidate:
    stage: int
    index: int  # in the stage's argv
    text: str  # the path as written (the whole element, or an option's value)
    option: bool  # the path is an option's value (--file=/x, -I/x)
    script: bool  # may be the script an interpreter runs (the runner picks the first existing file)
    exec_only: bool = False  # a wrapper's argument: a script only if it starts with #!


def interpreter(program: str) -> bool:
    return _INTERPRETER.fullmatch(posixpath.basename(program)) is not None


def wrapper(program: str) -> bool:
    return posixpath.basename(program) in _WRAPPERS


def _command_mode(element: str, shell: bool) -> bool:
    if element in _COMMAND_OPTIONS:
        return True
    return shell and element.startswith("-") and not element.startswith("--") and "c" in element[1:]


def candidates(stages: Sequence[Sequence[str]], programs: Sequence[str], *, cwd_given: bool) -> list[Candidate]:
    """The elements of a root job's argv that may name a path, in order.

    ``programs``: each stage's canonical binary (and argv[0] counts for the
    interpreter test too).  An element with a ``/`` may; a bare word only
    where the request chose its directory (the default, root's home, is
    root's) or where it may be an interpreter's script.  An option's value
    counts (``--config=/x``, ``-I/x``).
    """
    out: list[Candidate] = []
    for stage, argv in enumerate(stages):
        program = programs[stage] if stage < len(programs) else argv[0]
        runs_code = interpreter(program) or interpreter(argv[0])
        shell = (
            _SHELL.fullmatch(posixpath.basename(program)) is not None
            or _SHELL.fullmatch(posixpath.basename(argv[0])) is not None
        )
        wraps = wrapper(program) or wrapper(argv[0])
        command_mode = code_next = False
        for index, element in enumerate(argv[1:], start=1):
            if element in ("", "-", "--") or len(element) > 4096:
                continue
            if code_next and not element.startswith("-"):
                code_next = False  # the program text of -c/-e (or -m's module): code, not a path
                continue
            if element.startswith("-"):
                if runs_code and _command_mode(element, shell):
                    command_mode = code_next = True
                value = element.split("=", 1)[1] if "=" in element else element[element.find("/") :]
                if "/" in element and "/" in value:
                    out.append(Candidate(stage, index, value, option=True, script=False))
                continue
            may_run = runs_code and not command_mode
            if "/" in element or cwd_given or may_run:
                out.append(
                    Candidate(
                        stage,
                        index,
                        element,
                        option=False,
                        script=may_run or (wraps and "/" in element),
                        exec_only=wraps and not may_run,
                    )
                )
    if len(out) > MAX_CANDIDATES:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS,
            f"a root job may name at most {MAX_CANDIDATES} path arguments (got {len(out)})",
            {"field": "pipeline"},
        )
    return out


def worth_inspecting(stages: Sequence[Sequence[str]], programs: Sequence[str], *, cwd_given: bool) -> bool:
    """Whether a root job has any argument the runner must classify (`true` alone has none)."""
    return bool(candidates(stages, programs, cwd_given=cwd_given))


def parse_bound(untrusted: Any, stages: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """``bound["arguments"]`` as redeemed (the runner's side): checked against the spec's argv."""
    if untrusted is None:
        return []
    if not isinstance(untrusted, list):
        raise _bad("bound.arguments", "must be a list")
    out = []
    for n, item in enumerate(untrusted):
        field = f"bound.arguments[{n}]"
        if not isinstance(item, dict):
            raise _bad(field, "must be an object")
        stage, index = item.get("stage"), item.get("index")
        if not (_int(stage) and _int(index) and 0 <= stage < len(stages) and 1 <= index < len(stages[stage])):
            raise _bad(field, "must name a stage and an argument of the job")
        path, kind = item.get("path"), item.get("kind")
        if not isinstance(path, str) or not path.startswith("/") or kind not in KINDS:
            raise _bad(field, "must have an absolute path and a kind")
        if kind != "absent" and not (_int(item.get("dev")) and _int(item.get("ino"))):
            raise _bad(field, "must have a dev and an ino")
        if item.get("script") and (kind != "file" or not isinstance(item.get("sha256"), str)):
            raise _bad(field, "a script must be a file with a sha256")
        if item.get("script") and item.get("arg") != stages[stage][index]:
            raise _bad(field, "a script must be a whole argument of the job")
        out.append(dict(item))
    return out


def describe(item: dict[str, Any]) -> str:
    """One bound argument for a person: where it is, what was bound, and who else can change it."""
    what = "script" if item.get("script") else str(item.get("kind") or "file")
    bits = [what]
    if isinstance(item.get("sha256"), str):
        bits.append(f"sha256 {item['sha256'][:16]}")
    changeable = item.get("changeable")
    if isinstance(changeable, dict):
        bits.append(f"changeable: {changeable.get('path')} {changeable.get('why')}")
    return f"stage {int(item.get('stage', 0)) + 1} arg {item.get('index')} {item.get('path')} ({', '.join(bits)})"


FLAG = "CHANGEABLE"  # how every surface marks such an argument


def flagged(items: Any) -> list[str]:
    """Each bound argument as one line for a person (unsanitised: each surface escapes it its own way)."""
    if not isinstance(items, list):
        return []
    return [describe(item) for item in items if isinstance(item, dict)]


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(field: str, message: str) -> AirlockError:
    return AirlockError(ErrorCode.INVALID_ARGUMENTS, f"{field}: {message}", {"field": field})
