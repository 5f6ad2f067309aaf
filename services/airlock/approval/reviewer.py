"""The reviewer tier (issue 34): what a reviewer is shown, how its answer is read, and where it decides.

A reviewer is a site's command (``approval.reviewer_command``) asked about
each request a person would otherwise be asked about.  airlock-runner starts
it (runner/review.py: its own unprivileged user, a tight sandbox, a deadline,
bounded output); this module is approval's side.  Pure: no I/O.  It holds:

- `statement`: the request as the reviewer sees it -- the command, the
  binaries, who asks and as whom, the rule, the flagged arguments -- and never
  a value the request keeps from people's eyes: environment *names* only,
  no stdin, no file content (as the signed statement and ``approval.pending``).
- `read_answer`: the one JSON line ``{"decision": "allow|deny|ask", "reason":
  "..."}``.  A timeout, a crash, a non-zero exit or anything else is an
  ``ask`` (people decide), never an allow.
- `Opinion.decides`: an answer decides only where every deciding rule says
  ``reviewer: allow`` (allow or deny) or ``reviewer: deny`` (deny only), never
  on a quorum rule, never on a request with flagged arguments, never to allow
  what a person already denied.  Everywhere else it is an opinion shown to
  operators (``pending``, ``show``, ``watch``, the relay).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airlock.common import arguments

MAX_REASON = 500
# At most this many bytes of the reviewer's stdout are read (runner/review.py reads no more).
MAX_ANSWER_BYTES = 4096
ANSWERS = ("allow", "deny", "ask")


@dataclass(frozen=True, slots=True)
class Opinion:
    """A reviewer's answer as approval read it."""

    name: str
    decision: str  # allow, deny or ask (every failure is ask)
    reason: str
    outcome: str  # answered, timeout, crashed, garbage, unavailable
    may: str  # what the rules let it do here: allow, deny or advise
    decides: bool = False
    why_not: str = ""  # when it does not decide: why (advise, quorum, flagged arguments, denied by a person)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "decision": self.decision,
            "reason": self.reason,
            "outcome": self.outcome,
            "may": self.may,
            "decides": self.decides,
        }
        if self.why_not:
            out["why_not"] = self.why_not
        return out


def statement(
    *,
    request_id: str,
    request: Mapping[str, Any],
    spec: Mapping[str, Any],
    peer: Mapping[str, Any],
    run_as: Mapping[str, Any],
    policy: Mapping[str, Any],
    rule: str,
    may: str,
    bound: Mapping[str, Any],
) -> dict[str, Any]:
    """What the reviewer reads on stdin: the request, without a single protected value."""
    stages = [list(map(str, stage)) for stage in spec.get("stages") or []]
    out: dict[str, Any] = {
        "v": 1,
        "request_id": request_id,
        "host": str(request.get("host") or ""),
        "session": str(request.get("session") or ""),
        "reason": str(request.get("reason") or ""),
        "requester": {"uid": peer.get("uid"), "user": peer.get("user"), "groups": list(peer.get("groups") or [])},
        "privileged": bool(spec.get("privileged", request.get("privileged"))),
        "run_as": dict(run_as),
        "rule": rule,
        "reviewer_may": may,
        "stages": [
            {"argv": argv, "binary": (s.get("resolved") if isinstance(s, Mapping) else None)}
            for argv, s in zip(stages, list(policy.get("stages") or []) + [None] * len(stages), strict=False)
        ],
        "command": " | ".join(shlex.join(argv) for argv in stages),
        # Names only: values (and the protected ones) never leave approval for a reviewer.
        "env_names": sorted([*(spec.get("env") or {}), *(spec.get("protected_names") or [])]),
        "cwd": spec.get("cwd"),
        "stdin": spec.get("stdin") is not None,
        "arguments": arguments.flagged(bound.get("arguments")),
        "sandbox": list(bound.get("sandbox") or []),
    }
    return out


def read_answer(result: Mapping[str, Any]) -> tuple[str, str, str]:
    """(decision, reason, outcome) from the runner's report of one run; anything amiss is an ask."""
    if result.get("timed_out"):
        return "ask", "", "timeout"
    if result.get("exit_code") != 0:
        return "ask", "", "crashed"
    raw = result.get("stdout")
    if not isinstance(raw, str) or result.get("truncated"):
        return "ask", "", "garbage"
    text = raw[:-1] if raw.endswith("\n") else raw
    if not text or "\n" in text:
        return "ask", "", "garbage"
    try:
        answer = json.loads(text)
    except ValueError:
        return "ask", "", "garbage"
    if not isinstance(answer, dict) or set(answer) - {"decision", "reason"}:
        return "ask", "", "garbage"
    decision, reason = answer.get("decision"), answer.get("reason", "")
    if decision not in ANSWERS or not isinstance(reason, str):
        return "ask", "", "garbage"
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 1] + "…"
    return str(decision), reason, "answered"


def judge(name: str, result: Mapping[str, Any] | None, *, may: str, flagged: bool, denied_before: bool) -> Opinion:
    """The opinion, and whether it decides (module docstring)."""
    if result is None:
        decision, reason, outcome = "ask", "", "unavailable"
    else:
        decision, reason, outcome = read_answer(result)
    why_not = ""
    if decision == "ask":
        why_not = "it asked people" if outcome == "answered" else f"no answer ({outcome})"
    elif may == "advise":
        why_not = "the rule lets it advise only"
    elif decision == "allow" and may == "deny":
        why_not = "the rule lets it deny only"
    elif flagged:
        why_not = "others can change the job's path arguments: people decide"
    elif decision == "allow" and denied_before:
        why_not = "a person denied this request before: people decide"
    return Opinion(name, decision, reason, outcome, may, decides=not why_not, why_not=why_not)
