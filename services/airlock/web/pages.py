"""airlock-web's pages: server-rendered HTML, every value escaped (`markup.html`).

No inline script or style (the Content-Security-Policy forbids both), no
external asset: one stylesheet and one script from /static/.  The request page
shows what ``airlock show`` and the statement show: agent, run-as, command,
its working directory and stdin (size, sha256, the first lines: issue 45),
each stage's resolved binary, sandbox, a file operation's diff and hashes,
flagged path arguments, time left and quorum progress, and the exact
statement the passkey's assertion is bound to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from airlock.common import arguments, sandbox
from airlock.common import shown as shown_io
from airlock.common.render import command_line, duration, file_review, person, request_href
from airlock.common.trail import outcome_words
from airlock.web.markup import Markup, html, join, lines
from airlock.web.sessions import Session

# The grant lengths a person may choose on the approve form (approval checks approval.max_grant_seconds).
GRANT_CHOICES = ((900, "15 minutes"), (3600, "1 hour"), (4 * 3600, "4 hours"))


def layout(title: str, body: Markup, session: Session | None, host: str, *, refresh: int = 0) -> Markup:
    """A whole page; ``refresh``: reload every so many seconds (the pending list: a phone left open stays current)."""
    nav = Markup("")
    if session is not None:
        role = "operator" if session.decides else "observer (read only)"
        nav = html(
            '<nav><a href="/">Pending</a> <a href="/grants">Grants</a> <a href="/decisions">Decisions</a>'
            '<form class="signout" method="post" action="/signout">'
            '<input type="hidden" name="csrf" value="{csrf}">'
            '<span class="who">{account}, {role}</span> <button type="submit">Sign out</button></form></nav>',
            csrf=session.csrf,
            account=session.account,
            role=role,
        )
    return html(
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">{refresh}'
        "<title>{title} · airlock on {host}</title>"
        '<link rel="stylesheet" href="/static/airlock-web.css">'
        '<script src="/static/airlock-web.js" defer></script></head>'
        '<body><header><p class="brand">airlock on {host}</p>{nav}</header>'
        "<main><h1>{title}</h1>{body}</main></body></html>\n",
        title=title,
        host=host,
        nav=nav,
        body=body,
        refresh=html('<meta http-equiv="refresh" content="{s}">', s=refresh) if refresh else Markup(""),
    )


def shell() -> Markup:
    """A page's stand-in for a navigation, which cannot carry the tab's proof: the script loads the page."""
    return html(
        '<p class="status" data-airlock-load role="status">Loading…</p>'
        "<noscript><p>airlock-web needs JavaScript: the page is loaded with this tab's sign-in proof.</p></noscript>"
    )


def message(text: str, *, kind: str = "error") -> Markup:
    return html('<p class="{kind}" role="status">{text}</p>', kind=kind, text=text)


def _command(item: dict[str, Any]) -> str:
    request = item.get("request") or {}
    spec = request.get("spec") or {}
    stages = spec.get("stages") or request.get("stages") or []
    if stages:
        return " | ".join(command_line([str(a) for a in stage]) for stage in stages if isinstance(stage, list))
    return f"{request.get('tool') or ''} {request.get('path') or ''}".strip() or "(no command)"


def _run_as(item: dict[str, Any]) -> str:
    run_as = item.get("run_as") or {}
    user = run_as.get("user") or ""
    if item.get("privileged"):
        return f"{user or 'root'} (privileged)"
    return user or "the requesting user"


def _where_and_input(detail: dict[str, Any]) -> list[tuple[str, object]]:
    """Issue 45: a command's working directory and stdin (size and sha256), both bound to the ticket."""
    if detail.get("cwd") is None:
        return []
    return [("cwd", _code(detail.get("cwd"))), ("stdin", shown_io.stdin_line(detail.get("stdin")))]


def _io_line(detail: dict[str, Any]) -> Markup:
    """The summary's one line of cwd and stdin (the whole sha256 is in the details and the statement)."""
    if detail.get("cwd") is None:
        return Markup("")
    stdin = detail.get("stdin")
    said = "no stdin"
    if isinstance(stdin, dict):
        said = f"stdin {stdin.get('bytes')} bytes, sha256 {str(stdin.get('sha256'))[:12]}…"
    elif stdin is not None:
        said = "stdin " + shown_io.stdin_line(stdin)
    return html('<p class="io">in <code>{cwd}</code> · {stdin}</p>', cwd=detail.get("cwd"), stdin=said)


def pending_list(items: Sequence[dict[str, Any]], now: float | None = None) -> Markup:
    """Each request as a phone shows it first: the command, as whom (a red badge for root), from whom, why,
    how long is left; the request ID small (issue 46)."""
    if not items:
        return message("No request waits for a decision.", kind="note")
    now = time.time() if now is None else now
    rows = [
        html(
            '<li class="card"><a class="cmd" href="{href}"><code>{command}</code></a>'
            "<p>{badge} from <b>{user}</b> (uid {uid}) · {left}{quorum}</p>"
            '<p class="why">{reason}</p>{flags}<p class="rid">{request_id}</p></li>',
            href=request_href(str(p.get("request_id") or "")),
            request_id=p.get("request_id"),
            command=_command(p),
            badge=run_as_badge(p),
            user=(p.get("peer") or {}).get("user"),
            uid=(p.get("peer") or {}).get("uid"),
            left=time_left(p, now),
            quorum=_quorum_text(p),
            reason=p.get("reason") or "(no reason given)",
            flags=_flags(p),
        )
        for p in items
    ]
    return html('<ul class="cards">{rows}</ul>', rows=join(rows))


def run_as_badge(item: dict[str, Any]) -> Markup:
    """ "runs as ...": red when the job runs as root."""
    root = " root" if item.get("privileged") else ""
    return html('<span class="badge{root}">runs as {run_as}</span>', root=root, run_as=_run_as(item))


def time_left(item: dict[str, Any], now: float) -> Markup:
    """Time left, counting down live in the page (the script reads data-until)."""
    left = float(item.get("seconds_left") or 0)
    return html(
        '<span class="left" data-until="{until}">{text} left</span>', until=int(now + left), text=duration(left)
    )


def _flags(item: dict[str, Any]) -> Markup:
    """What deserves a second look before approving: arguments someone else can change."""
    flagged = arguments.flagged(item.get("arguments"))
    return html('<p class="flag">{f}</p>', f=arguments.FLAG) if flagged else Markup("")


def _quorum_text(p: dict[str, Any]) -> str:
    q = p.get("quorum") or {}
    if q.get("needed", 1) > 1 or q.get("approvals"):
        return f" · approvals {q.get('progress')}"
    return ""


def _dl(pairs: Iterable[tuple[str, object]]) -> Markup:
    rows = [html("<dt>{k}</dt><dd>{v}</dd>", k=k, v=v) for k, v in pairs]
    return html("<dl>{rows}</dl>", rows=join(rows))


def _code(text: object) -> Markup:
    return html("<code>{t}</code>", t=text)


def grant_allowed(detail: dict[str, Any]) -> bool:
    """Whether the approve form offers a grant: what approval would accept (approval/votes.py)."""
    q = detail.get("quorum") or {}
    policy = detail.get("policy") or {}
    request = detail.get("request") or {}
    return (
        "spec" in request
        and not detail.get("arguments")
        and int(q.get("needed") or 1) <= 1
        and policy.get("decision") == "ask"
        and detail.get("rule") != "hold"
    )


def request_view(shown: dict[str, Any], session: Session, now: float | None = None) -> Markup:
    """One request: everything an operator needs to decide, then the decide form (operators only)."""
    now = time.time() if now is None else now
    detail = shown.get("detail") if shown.get("pending") else None
    if not isinstance(detail, dict):
        return settled_view(shown)
    peer = detail.get("peer") or {}
    request = detail.get("request") or {}
    q = detail.get("quorum") or {}
    # What a person decides on first, in one glance: the command, as whom, from whom, how long.
    summary = html(
        '<div class="summary"><p class="cmd"><code>{command}</code></p>'
        "<p>{badge} from <b>{user}</b> (uid {uid}) · {left}{quorum}</p>"
        '<p class="why">{reason}</p>{io}{flags}<p class="rid">{request_id}</p></div>',
        command=_command(detail),
        badge=run_as_badge(detail),
        user=peer.get("user"),
        uid=peer.get("uid"),
        # Issue 45: where it runs and what it reads decide what it does: in the first screen, not folded.
        io=_io_line(detail),
        left=time_left(detail, now),
        quorum=_quorum_text(detail),
        reason=detail.get("reason") or "(no reason given)",
        flags=_flags(detail),
        request_id=detail.get("request_id"),
    )
    # The decision right under the summary (a phone's first screen); everything else folded below.
    if session.decides:
        decide = decide_form(detail, session, shown.get("expect"))
    else:
        decide = message("You signed in as an observer: you can read, not decide.", kind="note")
    pairs: list[tuple[str, object]] = [
        ("request", _code(detail.get("request_id"))),
        ("operation", _code(detail.get("operation_id") or "-")),
        ("agent", f"{peer.get('user')} (uid {peer.get('uid')}, pid {peer.get('pid')})"),
        ("session", detail.get("session") or "-"),
        ("runs as", _run_as(detail)),
        *_where_and_input(detail),
        ("reason", detail.get("reason") or "(none given)"),
        ("rule", detail.get("rule") or "-"),
        ("time left", f"{duration(float(detail.get('seconds_left') or 0))}"),
    ]
    if q:
        who = ", ".join(person(v) for v in q.get("approvers") or [])
        pairs.append(("approvals", f"{q.get('progress')}" + (f" ({who})" if who else "")))
    body: list[Markup] = [_dl(pairs)]
    stages = detail.get("stages") or []
    if stages:
        items = []
        for stage in stages:
            argv = [str(a) for a in stage.get("argv") or []]
            binary = stage.get("binary") or "(not found)"
            resolved = stage.get("resolved")
            link = f" → {resolved}" if stage.get("symlink") and resolved else ""
            identity = stage.get("identity") or {}
            ident = json.dumps(identity, sort_keys=True) if identity else ""
            items.append(
                html(
                    '<li><p class="cmd"><code>{argv}</code></p><p>binary <code>{binary}{link}</code></p>'
                    "{ident}<p>stage decision: {decision} (rule {rule})</p></li>",
                    argv=command_line(argv),
                    binary=binary,
                    link=link,
                    ident=html('<p class="ident">identity <code>{i}</code></p>', i=ident) if ident else Markup(""),
                    decision=stage.get("decision"),
                    rule=stage.get("rule"),
                )
            )
        body.append(html('<h2>Stages and binaries</h2><ol class="stages">{items}</ol>', items=join(items)))
    flagged = arguments.flagged(detail.get("arguments"))
    if flagged:
        body.append(
            html(
                '<h2>{flag}</h2><ul class="flagged">{items}</ul>',
                flag=arguments.FLAG,
                items=join(html("<li><code>{line}</code></li>", line=line) for line in flagged),
            )
        )
    boxes = detail.get("sandbox") or []
    body.append(
        html(
            "<h2>Sandbox</h2><p>{text}</p>",
            text="; ".join(f"stage {i}: {sandbox.describe(sb)}" for i, sb in enumerate(boxes, start=1))
            if boxes
            else "none: the job runs unconfined",
        )
    )
    env_names = detail.get("env_names") or []
    if env_names:
        body.append(html("<h2>Environment (names only)</h2><p><code>{names}</code></p>", names=" ".join(env_names)))
    excerpt = shown_io.excerpt_lines(request.get("stdin_excerpt"))
    if excerpt:  # issue 45: what the job reads, escaped like a diff (the whole: airlock show ID --stdin)
        body.append(
            html('<h2>Standard input (first lines)</h2><pre class="stdin">{t}</pre>', t=lines("\n".join(excerpt)))
        )
    review = file_review(request)
    if review:
        body.append(html("<h2>File</h2>{dl}", dl=_dl(review)))
    if request.get("diff"):
        body.append(html('<h2>Diff</h2><pre class="diff">{diff}</pre>', diff=lines(request["diff"])))
    if detail.get("statement"):
        body.append(
            html(
                "<h2>Statement</h2><p>Approving, your passkey signs a challenge derived from this statement "
                '(the one an SSH signature covers; a denial signs its deny twin):</p><pre class="statement">{s}</pre>',
                s=lines(detail["statement"]),
            )
        )
    details = html(
        '<details class="more"><summary>Details: agent, stages and binaries, sandbox, statement</summary>'
        "{body}</details>",
        body=join(body),
    )
    return join([summary, decide, details])


def decide_form(detail: dict[str, Any], session: Session, expect: object = None) -> Markup:
    grant = Markup("")
    if grant_allowed(detail):
        options = [html('<option value="">No grant: this run only</option>')]
        options += [
            html('<option value="{s}">{label}, this command</option>', s=f"command:{s}", label=label)
            for s, label in GRANT_CHOICES
        ]
        if (detail.get("policy") or {}).get("rule") not in (None, "", "default", "unresolved"):
            options += [
                html('<option value="{s}">{label}, everything its rule asks about</option>', s=f"rule:{s}", label=label)
                for s, label in GRANT_CHOICES
            ]
        grant = html(
            '<label for="grant">Also let the agent run it again without asking for</label>'
            '<select id="grant" name="grant">{options}</select>',
            options=join(options),
        )
    return html(
        '<form id="decide" class="decide" method="post" action="/decide">'
        '<input type="hidden" name="csrf" value="{csrf}">'
        '<input type="hidden" name="ref" value="{ref}">'
        # The digest of the statement this page showed: approval refuses (request_changed) if the
        # request pending under that ID now is another one, so a touch never signs what was not seen.
        '<input type="hidden" name="expect" value="{expect}">'
        '<label for="reason">Reason (the agent reads it when you deny)</label>'
        '<textarea id="reason" name="reason" maxlength="4096" rows="2"></textarea>'
        "{grant}"
        '<div class="buttons"><button class="allow" type="submit" name="decision" value="allow">'
        "Approve with passkey: run <code>{command}</code> as {run_as}</button>"
        '<button class="deny" type="submit" name="decision" value="deny">Deny with passkey: '
        "<code>{command}</code> does not run</button></div>"
        '<p id="decide-status" class="status" role="status"></p></form>',
        command=_short(_command(detail)),
        run_as=_run_as(detail),
        csrf=session.csrf,
        ref=detail.get("request_id"),
        expect=expect if isinstance(expect, str) else "",
        grant=grant,
    )


def _short(text: str, limit: int = 80) -> str:
    """A button's restatement of the command: whole when short, its start and an ellipsis when not."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def settled_view(shown: dict[str, Any]) -> Markup:
    request = shown.get("request") or {}
    decision = shown.get("decision") or {}
    outcome = shown.get("outcome") or {}
    stages = request.get("stages") or (request.get("spec") or {}).get("stages") or []
    pairs: list[tuple[str, object]] = [
        ("request", _code(shown.get("request_id"))),
        ("state", shown.get("state")),
        ("command", _code(" | ".join(command_line([str(a) for a in s]) for s in stages if isinstance(s, list)))),
        ("reason", shown.get("reason") or "-"),
    ]
    if decision:
        text = f"{decision.get('decision')} by {decision.get('by')} (rule {decision.get('rule')})"
        if decision.get("reason"):
            text += f": {decision.get('reason')}"
        pairs.append(("decision", text))
    if outcome:
        pairs.append(("outcome", outcome_words(outcome)))
    return html("{note}{dl}", note=message("This request is no longer pending.", kind="note"), dl=_dl(pairs))


def grants_list(grants: Sequence[dict[str, Any]]) -> Markup:
    if not grants:
        return message("No live grants.", kind="note")
    rows = [
        html(
            '<li class="card"><p><code>{gid}</code> · {scope}: <code>{covers}</code></p>'
            "<p>for uid {uid}{session} · given by {by} · {left} left</p></li>",
            gid=g.get("grant_id"),
            scope=g.get("scope"),
            covers=g.get("rule") if g.get("scope") == "rule" else g.get("command"),
            uid=g.get("uid"),
            session=f" (session {g['session']})" if g.get("session") else "",
            by=g.get("made_by"),
            left=duration(float(g.get("seconds_left") or 0)),
        )
        for g in grants
    ]
    return html('<ul class="cards">{rows}</ul>', rows=join(rows))


def decisions_list(events: Sequence[dict[str, Any]]) -> Markup:
    decided = [e for e in events if e.get("kind") == "approval.decided"]
    if not decided:
        return message("No decisions in the recent journal.", kind="note")
    rows = []
    for e in reversed(decided):
        payload = e.get("payload") or {}
        rows.append(
            html(
                '<li class="card"><p><a href="{href}">{rid}</a> · <b>{decision}</b> by {by}</p>'
                "<p>{time} · rule {rule}{reason}</p></li>",
                href=request_href(str(e.get("request_id") or "")),
                rid=e.get("request_id"),
                decision=payload.get("decision"),
                by=payload.get("by"),
                time=e.get("time"),
                rule=payload.get("rule"),
                reason=f" · {payload['reason']}" if payload.get("reason") else "",
            )
        )
    return html('<ul class="cards">{rows}</ul>', rows=join(rows))


def signin_page() -> Markup:
    return html(
        "<p>Sign in with the passkey you enrolled (<code>airlock passkey enroll</code>).</p>"
        '<form id="signin" class="signin" method="post" action="/signin">'
        '<button type="submit">Sign in with passkey</button>'
        '<p id="signin-status" class="status" role="status"></p></form>'
    )


def enroll_page(token: str, account: str, host: str | None = None) -> Markup:
    """The one-time enrollment page; ``host``: the host the fleet console carries the registration to."""
    return html(
        "<p>This one-time link adds a passkey to the account <b>{account}</b>. Your device asks for its PIN "
        "or biometric: user verification is required.</p>"
        '<form id="enroll" class="enroll" method="post" action="/enroll">'
        '<input type="hidden" name="token" value="{token}">{host}'
        '<button type="submit">Create passkey</button>'
        '<p id="enroll-status" class="status" role="status"></p></form>',
        token=token,
        account=account,
        host=html('<input type="hidden" name="host" value="{h}">', h=host) if host else Markup(""),
    )
