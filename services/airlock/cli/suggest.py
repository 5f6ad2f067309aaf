"""`airlock policy suggest [--since 7d] [--min 5] [--output FILE]`: rules learned from the journal (issue 34).

Reads the journal through the operator door (as `airlock stats` does) and
proposes a policy.d file of ``allow`` rules for the commands operators
approved again and again, for a person to review and install; nothing is
applied.

What counts: a request an operator (a person: ``approval.decided`` with an
``operator_uid`` or ``approvers``) approved within the window; its story
gives the agent (``request.received``), whether it ran as root, and each
stage's canonical binary (the decision's ``resolved``).  Left out, always:
file operations (a write's content was reviewed, not a shape), requests
whose path arguments someone other than root could change (flagged,
``arguments`` in ``approval.pending``), pipelines (a rule allows stages,
not the pipe between them), and any shape an operator or a rule ever denied
in the window.  Grants' uses and rules' allows are not approvals by a person.

Grouping: agent, privileged or not, binary, number of arguments, the
working directory and stdin (issue 45: both are part of what was approved).
Where the approved requests agree on an argument it is a literal; where they
differ, the placeholder carries the constraint the values support, never
more: every value a plain file name (no ``/``, not ``.`` or ``..``) becomes
``{argN:file}``, every value a file name in one fixed directory becomes
``DIR/{argN:file}`` (docs/policy.md); anything else splits the group into its
exact commands.  Every suggested rule pins the working directory it was
approved in (``cwd``, or ``cwd: none``: a relative path means something else
elsewhere) and its stdin (``stdin: none``, or ``stdin: sha256:…``: only the
exact input people saw); a request whose stdin digest cannot be told is never
learned.  A group approved ``--min`` times or more becomes a rule; its comment
says how often, when, who approved, and the cwd and stdin.  The file is checked with the policy loader before it is
written (the same parser approval uses), and a value that cannot be written
as a literal (``...``, ``{x}``) keeps its group out.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from airlock.approval import match
from airlock.approval.policyfile import PolicyError, parse_policy_text
from airlock.cli.base import _err
from airlock.cli.stats import decider, read_events, since_seconds, when
from airlock.common import shown
from airlock.common.codec import iso_utc

_SAFE_WORD = re.compile(r"[^A-Za-z0-9._@-]+")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,63}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SAFE_PATH = re.compile(r"[^A-Za-z0-9._@/+-]+")


@dataclass
class Approved:
    """One request an operator approved, as the journal tells it."""

    user: str
    privileged: bool
    binary: str
    args: tuple[str, ...]
    cwd: str | None  # as asked; None: none given
    stdin: str | None  # its sha256; None: no stdin
    at: float
    approvers: tuple[str, ...]


@dataclass
class _Story:
    received: Mapping[str, Any] | None = None
    flagged: bool = False
    decided: Mapping[str, Any] | None = None
    decided_at: float | None = None
    kinds: set[str] = field(default_factory=set)


def _word(text: object) -> str:
    """A name safe in a YAML comment and a rule name: letters, digits and ``._@-`` only."""
    return _SAFE_WORD.sub("_", str(text))[:64] or "_"


def _approvers(payload: Mapping[str, Any]) -> tuple[str, ...]:
    names = [
        str(a.get("user") or a.get("principal") or "") for a in payload.get("approvers") or [] if isinstance(a, dict)
    ]
    names = [n for n in names if n] or [str(payload.get("by") or "")]
    return tuple(_word(n) for n in names if n)


def stories(events: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, Any], _Story]:
    """Each request's records that matter here, by (agent uid, request ID)."""
    out: dict[tuple[Any, Any], _Story] = {}
    for event in events:
        kind = event.get("kind")
        if kind not in ("request.received", "approval.pending", "approval.decided"):
            continue
        payload = event.get("payload")
        if not isinstance(payload, Mapping):
            continue
        story = out.setdefault((event.get("peer_uid"), event.get("request_id")), _Story())
        story.kinds.add(str(kind))
        if kind == "request.received":
            story.received = payload
        elif kind == "approval.pending":
            story.flagged = story.flagged or bool(payload.get("arguments"))
        else:
            story.decided, story.decided_at = payload, when(event)
    return out


Shape = tuple[str, bool, str, tuple[str, ...], str | None, str | None]


def _stdin_digest(request: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(known, sha256 or None for no stdin) of a journaled request: its digest, or its base64 content.

    Anything else said about a stdin (a size alone, a damaged value) is not known: never learned.
    """
    value: Any = request.get("stdin_sha256")
    if value is None:
        value = request.get("stdin")
        if isinstance(value, Mapping):
            value = value.get("sha256") if "sha256" in value else False
        elif isinstance(value, str) and value:
            value = (shown.summary(value) or {}).get("sha256")
    if value is None or value == "":
        return True, None
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        return False, None
    return True, value


def _shape(story: _Story) -> Shape | None:
    """(agent, privileged, binary, args, cwd, stdin sha256) of a one-stage command, or None for anything
    suggest never learns."""
    received, decided = story.received, story.decided
    if received is None or decided is None or story.flagged:
        return None
    request = received.get("request")
    peer = received.get("peer")
    if not isinstance(request, Mapping) or not isinstance(peer, Mapping) or "tool" in request or "file" in request:
        return None
    stages = request.get("stages")
    policy = decided.get("policy")
    if not isinstance(stages, list) or len(stages) != 1 or not isinstance(policy, Mapping):
        return None
    decided_stages = policy.get("stages")
    if not isinstance(decided_stages, list) or len(decided_stages) != 1 or not isinstance(decided_stages[0], Mapping):
        return None
    binary = decided_stages[0].get("resolved")
    argv = stages[0]
    if not isinstance(binary, str) or not binary.startswith("/") or not isinstance(argv, list) or not argv:
        return None
    if not all(isinstance(a, str) for a in argv):
        return None
    user, uid = peer.get("user"), peer.get("uid")
    # A rule names the agent by user name, or by uid where the name is not a plain one.
    who = user if isinstance(user, str) and _PLAIN_NAME.fullmatch(user) else str(uid)
    if not who.isdigit() and not _PLAIN_NAME.fullmatch(who):
        return None
    known, stdin = _stdin_digest(request)
    cwd = request.get("cwd")
    if not known or not (cwd is None or (isinstance(cwd, str) and cwd.startswith("/"))):
        return None  # what was fed to it, or where it ran, cannot be pinned: not learned
    return who, bool(request.get("privileged")), binary, tuple(argv[1:]), cwd, stdin


def collect(events: Iterable[Mapping[str, Any]], start: float) -> tuple[list[Approved], set[Shape]]:
    """The approvals by a person since ``start``, and the shapes denied."""
    approved: list[Approved] = []
    denied: set[Shape] = set()
    for story in stories(events).values():
        decided = story.decided
        if decided is None or story.decided_at is None or story.decided_at < start:
            continue
        shape = _shape(story)
        if shape is None:
            continue
        decision = decided.get("decision")
        if decision == "deny":
            denied.add(shape)
        elif decision == "allow" and decider(decided) == "operator":
            approved.append(Approved(*shape, at=story.decided_at, approvers=_approvers(decided)))
    return approved, denied


def _literal_ok(arg: str) -> bool:
    """Whether ``arg`` can be written as a literal pattern element (not read as ``...`` or a placeholder)."""
    return arg != match.REST and not match.is_placeholder(arg) and not arg.endswith(match.FILE_TYPE)


def _directory(values: Iterable[str]) -> str | None:
    """The one absolute, normalised directory every value is a file name in, or None."""
    parents = {v.rpartition("/")[0] for v in values}
    if len(parents) != 1:
        return None
    (parent,) = parents
    if not parent.startswith("/") or match.path_pattern_problem(parent) is not None or match.REST in parent:
        return None
    return parent if all(match.file_name_accepts(v.rpartition("/")[2]) for v in values) else None


def _pattern(group: Sequence[Approved]) -> list[str] | None:
    """One pattern that matches every request of ``group`` (same binary and argument count), or None.

    A placeholder takes only what its values support: a file name, or a file name in one directory.
    """
    pattern = [group[0].binary]
    for index in range(len(group[0].args)):
        values = {a.args[index] for a in group}
        directory = _directory(values)
        if len(values) == 1:
            (value,) = values
            if not _literal_ok(value):
                return None
            pattern.append(value)
        elif all(match.file_name_accepts(v) for v in values):
            pattern.append(f"{{arg{index + 1}:file}}")
        elif directory is not None:
            pattern.append(f"{directory}/{{arg{index + 1}:file}}")
        else:
            return None
    return pattern


def _groups(approved: list[Approved], denied: set[Shape]) -> list[tuple[list[str], list[Approved]]]:
    by_shape: dict[tuple[str, bool, str, int, str | None, str | None], list[Approved]] = {}
    for a in approved:
        by_shape.setdefault((a.user, a.privileged, a.binary, len(a.args), a.cwd, a.stdin), []).append(a)
    out: list[tuple[list[str], list[Approved]]] = []
    for group in by_shape.values():
        pattern = _pattern(group)
        if pattern is not None:
            out.append((pattern, group))
            continue
        exact: dict[tuple[str, ...], list[Approved]] = {}  # no one pattern: each exact command on its own
        for a in group:
            exact.setdefault(a.args, []).append(a)
        for same in exact.values():
            if all(_literal_ok(x) for x in same[0].args):
                out.append(([same[0].binary, *same[0].args], same))
    kept = []
    for pattern, group in out:
        first = group[0]
        if any(
            d[0] == first.user
            and d[1] == first.privileged
            and d[2] == first.binary
            and match.match_args(pattern[1:], d[3])
            and (d[4], d[5]) == (first.cwd, first.stdin)
            for d in denied
        ):
            continue  # someone said no to a request this rule would allow: not a rule to suggest
        kept.append((pattern, group))
    return kept


def suggest(events: Iterable[Mapping[str, Any]], now: float, window: float, minimum: int) -> str:
    """The policy.d file's text (a comment alone when there is nothing to suggest)."""
    approved, denied = collect(events, now - window)
    head = [
        f"# airlock policy suggest: {iso_utc(now, timespec='seconds')}, from approvals since "
        f"{iso_utc(now - window, timespec='seconds')} (at least {minimum} each).",
        "# Review every rule before installing this file in /etc/airlock/policy.d/ (airlock-approval",
        "# reloads on SIGHUP); nothing here is applied until then.",
    ]
    rules: list[tuple[list[str], dict[str, Any]]] = []
    for pattern, group in sorted(_groups(approved, denied), key=lambda pg: (pg[1][0].user, pg[0])):
        if len(group) < minimum:
            continue
        first = group[0]
        who: Counter[str] = Counter(name for a in group for name in a.approvers)
        pinned = [first.cwd or match.NONE, first.stdin or match.NONE]
        key = [first.user, str(first.privileged), *pattern, *pinned]
        digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:8]
        name = f"suggested-{_word(first.user)}-{_word(Path(first.binary).name)}-{digest}"
        earliest, latest = (iso_utc(f(a.at for a in group), timespec="seconds") for f in (min, max))
        comment = [
            f"# approved {len(group)} time{'s' if len(group) != 1 else ''} for {_word(first.user)}"
            f" ({'as root' if first.privileged else 'as itself'}), {earliest} to {latest}",
            "# approved by: " + ", ".join(f"{n} ({c})" for n, c in sorted(who.items())),
        ]
        comment.append(
            f"# cwd: {_SAFE_PATH.sub('_', first.cwd)[:200] if first.cwd else 'none given'}; stdin: "
            + (f"sha256 {first.stdin} (only this exact input)" if first.stdin else "none")
            + " (both pinned, as approved)"
        )
        varied = sum(1 for p in pattern[1:] if p.endswith(match.FILE_TYPE))
        if varied:
            comment.append(
                f"# {varied} argument(s) varied: each {{argN:file}} takes one file name, no / or .. (docs/policy.md)"
            )
        rule = {
            "name": name,
            "decision": "allow",
            "description": f"learned from {len(group)} approvals",
            "users": [first.user],
            "privileged": first.privileged,
            "cwd": first.cwd or match.NONE,
            "stdin": f"sha256:{first.stdin}" if first.stdin else match.NONE,
            "commands": [pattern],
        }
        rules.append((comment, rule))
    if not rules:
        return "\n".join([*head, "# nothing to suggest: no command was approved often enough", "rules: []", ""])
    body = ["rules:"]
    for comment, rule in rules:
        dumped = yaml.safe_dump([rule], sort_keys=False, default_flow_style=None, width=1000, allow_unicode=False)
        body += ["  " + line for line in comment]
        body += ["  " + line for line in dumped.rstrip("\n").split("\n")]
    return "\n".join([*head, *body, ""])


def check(text: str, source: str) -> str | None:
    """The loader's complaint about the suggested file, or None: it loads as approval would load it."""
    try:
        parse_policy_text(text, source, main=False)
    except PolicyError as exc:
        return str(exc)
    return None


def cmd_policy_suggest(ns: argparse.Namespace) -> int:
    window = since_seconds(ns.since)
    if window is None:
        _err(f"policy suggest: --since takes a duration like 7d or 24h (got {ns.since!r})")
        return 2
    if ns.min < 1:
        _err("policy suggest: --min must be 1 or more")
        return 2
    events = read_events(ns)
    if events is None:
        return 1
    text = suggest(events, time.time(), window, ns.min)
    problem = check(text, ns.output or "<suggested>")
    if problem is not None:  # a bug here, never a file approval would refuse
        _err(f"policy suggest: the suggestion does not load: {problem}")
        return 1
    if ns.output:
        try:
            Path(ns.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            _err(f"policy suggest: cannot write {ns.output}: {exc.strerror}")
            return 1
        _err(f"policy suggest: wrote {ns.output} (review it, then copy it into policy.d)")
    else:
        sys.stdout.write(text)
    return 0
