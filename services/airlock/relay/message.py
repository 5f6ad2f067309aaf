"""From audit events to messages (each channel makes its own bytes of one: airlock.common.channels).

Pure: no I/O; the relay's service feeds events in and sends what comes out.  What
an agent chose (argv, reason, paths) is sanitised on the way in
(`airlock.common.render.sanitise`), so no channel ever shows a control or bidi
character that could make the text lie.  Environment *values* are never
included (names only), and protected values are not in the events feed; a
command's stdin is its size and sha256 (issue 45: the feed holds no more).
"""

from __future__ import annotations

from typing import Any

from airlock.common import arguments, shown
from airlock.common.codec import iso_utc, parse_iso
from airlock.common.render import command_line, decision_line, duration, request_href, reviewer_line, sanitise

# The audit event kinds the relay turns into messages (operator.action: a grant's end only, issue 34).
KINDS = frozenset({"approval.pending", "approval.decided", "operator.action"})
# The grant ends the relay announces: its time is up, or its uses are used up (a revoke is an operator's own act).
GRANT_ENDS = {"grant.expired": "expired", "grant.exhausted": "used up"}

_MAX_TEXT = 1500  # one argv can be long; a chat message should not be


def _s(value: object, *, strict: bool = False) -> str:
    """Sanitised text; nothing (None) stays empty."""
    return "" if value is None else sanitise(value, strict=strict)


_parse_time = parse_iso  # the relay's name for it (worker.py reads expiries with it too)


def _clip(text: str, limit: int = _MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def what_of(request: dict[str, Any]) -> tuple[str, str]:
    """(mode, one sanitised line): the command (stages joined by |) or the file operation."""
    if request.get("tool"):
        return "file", f"{_s(request.get('tool'), strict=True)} {_s(request.get('path'), strict=True)}"
    stages = request.get("stages") or (request.get("spec") or {}).get("stages") or []
    lines = [command_line([str(a) for a in stage]) for stage in stages if isinstance(stage, list)]
    return "exec", _clip(" | ".join(lines) or "(no command)")


def request_link(web_url: str, request_id: str, uid: object) -> str | None:
    """Issue 33: the request's page on airlock-web (``web.url``), exact: ``AGENT/ID`` by uid; None without a web."""
    if not web_url or not request_id:
        return None
    return request_href(f"{uid}/{request_id}" if isinstance(uid, int) else request_id, web_url)


def pending_message(event: dict[str, Any], host: str, user_of: Any, now: float, web_url: str = "") -> dict[str, Any]:
    """The message for an ``approval.pending`` event.  ``user_of(uid)`` names a uid; ``web_url``: web.url."""
    payload = event.get("payload") or {}
    request = payload.get("request") or {}
    spec = request.get("spec") or {}
    mode, what = what_of(request)
    uid = event.get("peer_uid")
    privileged = bool(spec.get("privileged", request.get("privileged")))
    target = spec.get("uid", request.get("uid"))
    run_as = "root" if privileged else (user_of(target) if isinstance(target, int) else user_of(uid))
    if isinstance(spec.get("user"), int):  # issue 48: a privileged job as another account
        run_as = user_of(spec["user"])
    started = _parse_time(event.get("time")) or now
    timeout = float(payload.get("timeout_seconds") or 0)
    expires = started + timeout
    request_id = _s(event.get("request_id"), strict=True)
    host = _s(host, strict=True)
    message = {
        "seq": event.get("seq"),
        "time": _s(event.get("time"), strict=True) or None,  # the journal event's (a fleet console's relay lag)
        "event": "pending",
        "host": host,
        "request_id": request_id,
        "operation_id": _s(event.get("operation_id"), strict=True) or None,
        "user": _s(user_of(uid)) if isinstance(uid, int) else None,
        "uid": uid,
        "run_as": _s(run_as),
        "privileged": privileged,
        "mode": mode,
        "what": what,
        "env_names": sorted(_s(n, strict=True) for n in (spec.get("env") or request.get("env") or {})),
        # Issue 45: where it runs and what it reads, bound to the ticket: stdin by size and sha256 only.
        "cwd": _s(shown.cwd_line(spec.get("cwd", request.get("cwd")), privileged=privileged), strict=True)
        if mode == "exec"
        else None,
        "stdin": _s(shown.stdin_line(spec.get("stdin", request.get("stdin")))) if mode == "exec" else None,
        # Issue 27: path arguments someone other than root can change (bound to the approval, no grant).
        "changeable": [_clip(_s(line), 500) for line in arguments.flagged(payload.get("arguments"))],
        "rule": _s(payload.get("rule")),
        "reason": _clip(_s(request.get("reason")), 500),
        # Issue 34: the reviewer's opinion, escaped like every request value.
        "reviewer": _clip(_s(reviewer_line(payload.get("reviewer"))), 700),
        "seconds_left": round(max(0.0, expires - now), 1),
        "expires_at": iso_utc(expires, timespec="seconds"),
        "link": request_link(web_url, request_id, uid),
        "decide": decision_line("approve", request_id, host=host, options=_expect(payload)),
        "deny": decision_line("deny", request_id, host=host, options=_expect(payload)),
    }
    return message | _signing(payload, request_id) | _texts(message | _signing(payload, request_id))


def _expect(payload: dict[str, Any]) -> tuple[str, ...]:
    """Issue 27: ``--expect DIGEST``, so the line acts only on the request this message shows."""
    digest = payload.get("expect")
    if isinstance(digest, str) and len(digest) == 12 and all(c in "0123456789abcdef" for c in digest):
        return ("--expect", digest)
    return ()


SIGN_LINE = "ssh-keygen -Y sign -n airlock-approval -f ~/.ssh/id_ed25519 < statement.txt > statement.sig"


def _signing(payload: dict[str, Any], request_id: str) -> dict[str, Any]:
    """Issue 18: the statement to sign and the one-line signing command (when approval publishes one).

    The statement is printable ASCII lines by construction (approval/statement.py, every
    value JSON-escaped); anything else is left out rather than sent altered.
    """
    statement = payload.get("statement")
    if not isinstance(statement, str) or not all(" " <= c <= "~" for c in statement.replace("\n", "")):
        return {}
    out: dict[str, Any] = {
        "statement": statement,
        "sign": SIGN_LINE,
        "submit": decision_line("approve", request_id, options=(*_expect(payload), "--signature", "statement.sig")),
    }
    requirement = payload.get("requirement")
    if isinstance(requirement, dict) and isinstance(requirement.get("approvals"), int) and requirement["approvals"] > 1:
        out["approvals_needed"] = requirement["approvals"]
    return out


def decided_message(event: dict[str, Any], host: str, known: dict[str, Any] | None) -> dict[str, Any] | None:
    """The follow-up for an ``approval.decided`` event after a pending one (None for a rule's decision)."""
    payload = event.get("payload") or {}
    if payload.get("by") == "policy" or str(payload.get("by") or "").startswith("reviewer "):
        return None  # nobody was asked (issue 34: the reviewer decides only before people are)
    request_id = _s(event.get("request_id"), strict=True)
    message: dict[str, Any] = {
        "seq": event.get("seq"),
        "time": _s(event.get("time"), strict=True) or None,
        "event": "decided",
        "host": _s(host, strict=True),
        "request_id": request_id,
        "operation_id": _s(event.get("operation_id"), strict=True) or None,
        "decision": _s(payload.get("decision")),
        "by": _s(payload.get("by")),
        "decided_reason": _clip(_s(payload.get("reason")), 500),
        "rule": _s(payload.get("rule")),
    }
    if known:
        for key in ("user", "run_as", "privileged", "mode", "what", "reason"):
            message[key] = known.get(key)
    return message | _texts(message)


def grant_message(event: dict[str, Any], host: str, user_of: Any) -> dict[str, Any] | None:
    """The message for a grant's end (issue 34): ``grant.expired`` or ``grant.exhausted`` (None for any
    other operator action).  Only approval's own records (the feed names the writer) are announced."""
    payload = event.get("payload") or {}
    action = payload.get("action")
    if action not in GRANT_ENDS or event.get("writer") not in (None, "approval"):
        return None
    uid = payload.get("agent_uid")
    uses, used = payload.get("uses"), payload.get("used")
    message: dict[str, Any] = {
        "seq": event.get("seq"),
        "event": "grant",
        "host": _s(host, strict=True),
        "grant_id": _s(payload.get("grant_id"), strict=True),
        "ended": GRANT_ENDS[action],
        "request_id": _s(event.get("request_id"), strict=True) or None,
        "user": _s(user_of(uid)) if isinstance(uid, int) and not isinstance(uid, bool) else None,
        "uid": uid if isinstance(uid, int) and not isinstance(uid, bool) else None,
        "what": _clip(_s(payload.get("command"))),
        "scope": _s(payload.get("scope")),
        "rule": _s(payload.get("rule")),
        "granted_by": _s(payload.get("granted_by")),
        "used": used if isinstance(used, int) and not isinstance(used, bool) else None,
        "uses": uses if isinstance(uses, int) and not isinstance(uses, bool) else None,
    }
    return message | _texts(message)


def policy_message(event: dict[str, Any], host: str) -> dict[str, Any] | None:
    """The message for ``policy.rejected`` (issue 44): the files on disk were refused, and what decides."""
    payload = event.get("payload") or {}
    if event.get("writer") not in (None, "approval"):
        return None
    refused = [_clip(_s(e)) for e in payload.get("refused") or [] if isinstance(e, str)][:10]
    message: dict[str, Any] = {
        "seq": event.get("seq"),
        "event": "policy",
        "host": _s(host, strict=True),
        "mode": _s(payload.get("mode"), strict=True),
        "sentence": _clip(_s(payload.get("sentence"))),
        "refused": refused,
    }
    return message | _texts(message)


def reminder(message: dict[str, Any], now: float) -> dict[str, Any]:
    expires = _parse_time(message.get("expires_at")) or now
    out = message | {"event": "reminder", "seconds_left": round(max(0.0, expires - now), 1)}
    return out | _texts(out)


def digest(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Several pending messages as one; it carries the last item's seq."""
    out: dict[str, Any] = {
        "seq": items[-1].get("seq"),
        "event": "digest",
        "host": items[0].get("host"),
        "count": len(items),
        "items": items,
    }
    return out | _texts(out)


_VERDICT = {"allow": "approved", "deny": "denied", "timeout": "timed out", "withdrawn": "withdrawn by the agent"}


def _texts(m: dict[str, Any]) -> dict[str, str]:
    """A title and a plain-text body for channels that show text."""
    kind = m["event"]
    if kind == "digest":
        title = f"airlock: {m['count']} requests wait for approval on {m['host']}"
        body = "\n\n".join(item["text"] for item in m["items"])
        return {"title": title, "text": body}
    if kind == "grant":
        title = f"airlock: grant {m['grant_id']} {m['ended']} on {m['host']}"
        covers = f"rule {m['rule']}" if m.get("scope") == "rule" else m.get("what") or "(unknown)"
        used = f"used {m['used']}" + (f" of {m['uses']}" if m.get("uses") is not None else "") + " times"
        lines = [
            title.removeprefix("airlock: "),
            f"for: {m['user'] or '?'} (uid {m['uid']})",
            f"covered: {covers}",
            f"given by: {m['granted_by'] or '?'}; {used if m.get('used') is not None else ''}".rstrip("; "),
            "the same request asks an operator again",
            f"(event {m['seq']})",
        ]
        return {"title": title, "text": "\n".join(lines)}
    if kind == "policy":
        title = f"airlock: policy files refused on {m['host']}"
        lines = [title.removeprefix("airlock: "), m["sentence"], *m["refused"], f"(event {m['seq']})"]
        return {"title": title, "text": "\n".join(lines)}
    if kind == "decided":
        verdict = _VERDICT.get(m["decision"], m["decision"])
        by = f" by {m['by']}" if m.get("by") and m["decision"] in ("allow", "deny") else ""
        title = f"airlock: {m['request_id']} {verdict}{by} on {m['host']}"
        lines = [title.removeprefix("airlock: ")]
        if m.get("what"):
            lines.append(f"{m.get('mode') or 'exec'}: {m['what']}")
        if m.get("decided_reason"):
            lines.append(f"why: {m['decided_reason']}")
        lines.append(f"(event {m['seq']})")
        return {"title": title, "text": "\n".join(lines)}
    prefix = "reminder: " if kind == "reminder" else ""
    title = f"airlock: {prefix}approve? {_clip(m['what'], 80)} on {m['host']}"
    lines = [
        f"{prefix}request {m['request_id']} on {m['host']} waits for approval",
        f"from: {m['user']} (uid {m['uid']})",
        f"runs as: {m['run_as']}" + (" (privileged)" if m["privileged"] else ""),
        f"{'command' if m['mode'] == 'exec' else 'file'}: {m['what']}",
        *([f"cwd: {m['cwd']}", f"stdin: {m['stdin']}"] if m.get("cwd") else []),
        *(f"{arguments.FLAG} by others (bound to this approval): {line}" for line in m.get("changeable") or []),
        f"rule: {m['rule']}",
        f"reason: {m['reason'] or '(none given)'}",
        *([m["reviewer"]] if m.get("reviewer") else []),
        f"time left: {duration(m['seconds_left'])} (until {m['expires_at']})",
        *([f"open: {m['link']}"] if m.get("link") else []),
        f"approve: {m['decide']}",
        f"deny: {m['deny']}",
    ]
    if m.get("approvals_needed"):
        lines.append(f"needs {m['approvals_needed']} distinct approvers")
    if m.get("statement"):
        lines += [
            "or sign this statement (save it as statement.txt, exactly, final newline included):",
            m["statement"].rstrip("\n"),
            f"sign: {m['sign']}",
            f"then: {m['submit']}",
        ]
    lines.append(f"(event {m['seq']})")
    return {"title": title, "text": "\n".join(lines)}
