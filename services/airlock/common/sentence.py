"""An audit record as one sentence a person reads in journald, in sudo's spirit (issue 32).

``deploy : USER=root ; CWD=/ ; COMMAND=/usr/bin/df -h ; REQUEST=r-1`` is what
sudo's log line taught every sysadmin to read; airlock's records say who asked,
as whom, what (shortened), who or what decided, and the outcome.  The
structured ``AIRLOCK_*`` fields stay as they were: this is the ``MESSAGE``
only.  Every value from a request is neutralised (`render.sanitise`) and
quoted as a shell would (`shlex.join`), so a command's text cannot fake a
field or another line.

Pure: no I/O.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airlock.common.render import sanitise
from airlock.common.trail import exit_words

COMMAND_CHARS = 200  # a journald line stays one line a person reads; the record has it whole

UserOf = Callable[[int], str]


def command_text(stages: Any) -> str:
    """A pipeline as a person would type it, shortened; a stage named by digest says so."""
    if not isinstance(stages, Sequence) or isinstance(stages, str) or not stages:
        return "?"
    parts = []
    for stage in stages:
        if isinstance(stage, Mapping):
            parts.append(f"<argv sha256 {str(stage.get('argv_sha256', ''))[:12]}…>")
        elif isinstance(stage, Sequence) and not isinstance(stage, str):
            parts.append(shlex.join(str(word) for word in stage))
        else:
            parts.append("?")
    text = sanitise(" | ".join(parts))
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"


def _who(uid: Any, user_of: UserOf) -> str:
    return sanitise(user_of(uid)) if isinstance(uid, int) and not isinstance(uid, bool) else "?"


def _fields(*pairs: tuple[str, Any]) -> str:
    return " ; ".join(f"{key}={value}" for key, value in pairs if value not in (None, ""))


def _stages_of(payload: Mapping[str, Any]) -> Any:
    for holder in (payload.get("request"), payload.get("spec"), payload.get("policy")):
        if isinstance(holder, Mapping) and holder.get("stages") is not None:
            stages = holder["stages"]
            # approval's policy stages are objects with their argv
            if isinstance(stages, list) and stages and isinstance(stages[0], Mapping) and "argv" in stages[0]:
                return [stage.get("argv") for stage in stages]
            return stages
    if isinstance(payload.get("request"), Mapping) and payload["request"].get("tool"):
        request = payload["request"]
        return [[str(request.get("tool")), str(request.get("path", ""))]]
    return None


def _run_as(payload: Mapping[str, Any], user_of: UserOf) -> str | None:
    for holder in (payload, payload.get("request"), payload.get("spec")):
        if not isinstance(holder, Mapping):
            continue
        named = holder.get("run_as")
        if isinstance(named, Mapping):
            named = named.get("uid")
        if isinstance(named, int) and not isinstance(named, bool):
            return _who(named, user_of)  # whom it runs as, said outright (root, or another account: issue 48)
        other = holder.get("user")  # a spec's privileged job as another account (issue 48)
        if isinstance(other, int) and not isinstance(other, bool):
            return _who(other, user_of)
        if isinstance(holder.get("privileged"), bool) and holder["privileged"]:
            return "root"
        uid = holder.get("uid")
        if isinstance(uid, int) and not isinstance(uid, bool):
            return _who(uid, user_of)
    return None


def sentence(
    kind: str, payload: Mapping[str, Any], request_id: str | None, peer_uid: int | None, user_of: UserOf
) -> str | None:
    """The MESSAGE of an audit record of ``kind``, or None to keep the event's own summary."""
    who = _who(peer_uid, user_of)
    request = sanitise(request_id) if request_id else None
    command = command_text(_stages_of(payload))
    as_whom = _run_as(payload, user_of)
    if kind == "request.received":
        return f"{who} : asks ; " + _fields(("USER", as_whom), ("COMMAND", command), ("REQUEST", request))
    if kind in ("approval.pending", "approval.promoted"):
        wait = payload.get("timeout_seconds")
        left = f"{wait:g}s" if isinstance(wait, int | float) else None
        waits = "waits for an operator" if kind == "approval.pending" else "waits for an operator on its own"
        return f"{who} : {waits} ; " + _fields(
            ("USER", as_whom),
            ("COMMAND", command),
            ("RULE", _text(payload.get("rule"))),
            ("WAIT", left),
            ("REQUEST", request),
        )
    if kind == "approval.decided":
        decision = _text(payload.get("decision")) or "?"
        by = _text(payload.get("by"))
        what = _fields(("USER", as_whom), ("COMMAND", command), ("REQUEST", request))
        decider = f"by rule {_text(payload.get('rule'))}" if by in (None, "policy") else f"by {by}"
        operator = payload.get("operator")
        if by == "grant":
            decider = f"by grant {_text(payload.get('grant_id'))} (rule {_text(payload.get('rule'))})"
        elif by in (None, "policy") and payload.get("rule") == "unresolved":
            decider = "(command not found)"  # the agent was told so, not that a rule said no (issue 32)
        elif by == "timeout":
            decider = "(no operator decided)"
        elif by == "agent":
            decider = "(by the agent, before a decision)"
        elif by is not None and by.startswith("release by "):
            decider = f"at the {by}"  # the hold alone kept it waiting; its rule allows it
        elif isinstance(operator, str) and by != "policy":
            decider = f"by operator {sanitise(operator)}"
        elif isinstance(payload.get("operator_uid"), int) and by != "policy":
            decider = f"by operator {by}"  # approval's record: `by` names the operator (or the voters)
        return f"{who} : {decision} {decider} ; {what}"
    if kind == "exec.started":
        command = command_text(_resolved(_stages_of(payload), payload.get("binaries")))
        cwd = payload.get("cwd")
        return f"{who} : " + _fields(
            ("USER", as_whom),
            ("CWD", sanitise(cwd) if isinstance(cwd, str) else None),
            ("COMMAND", command),
            ("REQUEST", request),
        )
    if kind == "exec.finished":
        codes = payload.get("exit_codes")
        stages = payload.get("stages")
        last = stages[-1] if isinstance(stages, list) and stages and isinstance(stages[-1], Mapping) else {}
        # As a shell says it: 143 (SIGTERM) for a stage a signal ended (exit_codes holds None for it).
        code = codes[-1] if isinstance(codes, list) and codes else None
        exit_code = exit_words(code, last.get("signal")) if code is not None or last.get("signal") else None
        how = "timed out" if payload.get("timed_out") else "cancelled" if payload.get("cancelled") else None
        killed = payload.get("killed")
        if isinstance(killed, dict):  # an operator's kill (issue 35): the signal and who sent it
            how = f"killed ({_text(killed.get('signal'))}) by {_text(killed.get('by'))}"
        duration = payload.get("duration_ms")
        took = f"{duration} ms" if isinstance(duration, int) else None
        return f"{who} : finished ; " + _fields(
            ("EXIT", exit_code), ("STOPPED", how), ("TOOK", took), ("REQUEST", request)
        )
    if kind in ("service.started", "service.stopping") and payload.get("service"):
        # Which service (issue 44): the WHO of `airlock events` is a person's, so the name leads the words.
        what = "started" if kind == "service.started" else "stopping"
        return f"airlock : airlock-{_text(payload.get('service'))} {what} ; " + _fields(
            ("PID", payload.get("pid") if isinstance(payload.get("pid"), int) else None),
            ("VERSION", _text(payload.get("version"))),
        )
    if kind == "exec.refused":
        return f"{who} : refused by the runner ; " + _fields(
            ("CODE", _text(payload.get("code"))), ("WHY", _text(payload.get("message"))), ("REQUEST", request)
        )
    if kind == "request.replied":
        status = _text(payload.get("status")) or ("ok" if payload.get("ok") else None)
        code = _text(payload.get("code"))
        return f"{who} : answered ; " + _fields(("STATUS", status), ("CODE", code), ("REQUEST", request))
    return None


def _resolved(stages: Any, binaries: Any) -> Any:
    """Each stage with the binary the runner executes in place of argv[0] (as sudo logs the full path)."""
    if not isinstance(stages, list) or not isinstance(binaries, list) or len(binaries) != len(stages):
        return stages
    out = []
    for stage, held in zip(stages, binaries, strict=True):
        path = held.get("path") if isinstance(held, Mapping) else None
        is_argv = isinstance(stage, list) and stage
        out.append([path, *stage[1:]] if is_argv and isinstance(path, str) else stage)
    return out


def _text(value: Any) -> str | None:
    return sanitise(value) if isinstance(value, str) and value else None
