"""The fleet console's per-host panel (issue 49): one host's pending count, running jobs with a kill button,
hold and release, the relay's last post and lag, the collector's verdict, last contact; and the filters.

Markup only (`markup.html` escapes every value: each is what a host, its relay or the collector said).
Every button is a form the page's script turns into a passkey touch (static/airlock-fleet.js): the host
makes the action statement and checks the touch itself (approval/hostactions.py).  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airlock.common.codec import iso_utc
from airlock.web import fleetview
from airlock.web.markup import Markup, html, join

HOST = """<li class="card fleet-host" data-host="{host}">
<p class="ref">{host}: {state}</p>
<p>{pending} pending · last contact {contact}</p>
<p>{hold}</p>
{hold_form}
<p>relay: {relay}</p>
{collector}
<ul class="jobs">{jobs}</ul>
</li>
"""

JOB = """<li><p class="cmd"><code>{command}</code></p>
<p>as {as_} for {agent} since {since} <span class="rid">{job}</span></p>
<form class="fleet-act" data-action="kill" data-hosts="{host}" data-ref="{ref}">
<input type="hidden" name="reason" value="">
<button class="deny" type="submit">Kill on {host}</button></form></li>
"""

HOLD_FORM = """<form class="fleet-act" data-action="{action}" data-hosts="{hosts}">
{reason}<button class="{kind}" type="submit">{label}</button></form>
"""
REASON = '<input name="reason" maxlength="4096" placeholder="why hold (required)" required>'


def when(seconds: object) -> str:
    return iso_utc(float(seconds), timespec="seconds") if isinstance(seconds, int | float) and seconds else "never"


def hold_form(hosts: list[str], held: bool | None, label: str) -> Markup:
    """Hold (a reason asked) or release ``hosts``; both when the state is unknown (several hosts)."""
    joined = ",".join(hosts)
    out = []
    if held is not True:
        out.append(
            html(HOLD_FORM, action="hold", hosts=joined, reason=Markup(REASON), kind="deny", label=f"Hold {label}")
        )
    if held is not False:
        out.append(
            html(HOLD_FORM, action="release", hosts=joined, reason=Markup(""), kind="allow", label=f"Release {label}")
        )
    return join(out)


def every_form(hosts: list[str]) -> Markup:
    if len(hosts) < 2:
        return Markup("")
    return html('<div class="card every">{forms}</div>', forms=hold_form(hosts, None, f"all {len(hosts)} hosts shown"))


def filter_form(filters: fleetview.Filters, names: list[str]) -> Markup:
    options = join(
        html(
            '<option value="{v}"{sel}>{t}</option>',
            v=n,
            t=n or "every host",
            sel=Markup(" selected") if n == filters.group else Markup(""),
        )
        for n in ["", *names]
    )
    return html(FILTER, options=options, agent=filters.agent, rule=filters.rule)


FILTER = """<form class="filters" method="get" action="/">
<label>host group <select name="group">{options}</select></label>
<label>agent <input name="agent" value="{agent}" placeholder="user or uid"></label>
<label>rule <input name="rule" value="{rule}"></label>
<button type="submit">Filter</button></form>
"""


def relay_line(mark: Mapping[str, Any] | None) -> str:
    if not mark:
        return "no post yet"
    lag = f", lag {mark['lag']:g}s" if mark.get("lag") is not None else ""
    return f"seq {mark.get('seq')} at {when(mark.get('time'))}{lag} (received {when(mark.get('received'))})"


def collector_line(verdict: Mapping[str, Any] | None, configured: bool) -> Markup:
    if not configured:
        return Markup("")
    if verdict is None:
        return html("<p>collector: not verified yet</p>")
    if verdict.get("ok"):
        claims = verdict.get("unproven") or 0
        return html(
            "<p>collector: <strong>verified</strong> to seq {to} by key {key} (checked {at}){claims}</p>",
            to=verdict.get("proven_to"),
            key=verdict.get("key") or "",
            at=when(verdict.get("checked")),
            claims=html(
                '; <strong class="flag">{n} entr{y} claim this host that its key does not prove</strong>',
                n=claims,
                y="y" if claims == 1 else "ies",
            )
            if claims
            else Markup(""),
        )
    return html(
        '<p>collector: <strong class="flag">NOT VERIFIED</strong> {why} (checked {at})</p>',
        why=verdict.get("problem") or "",
        at=when(verdict.get("checked")),
    )


def host(panel: Mapping[str, Any], collector: bool) -> Markup:
    host = str(panel["host"])
    state = {"ok": "ok", "connecting": "connecting"}.get(panel["state"], f"FAILING {panel['error']}")
    hold = panel.get("hold")
    if hold is None:
        held_text, held = "hold: unknown", None
    elif hold["held"]:
        held_text, held = f"ON HOLD by {hold.get('by')} since {hold.get('since')}: {hold.get('reason')}", True
    else:
        held_text, held = "accepting (not on hold)", False
    jobs = join(
        html(
            JOB,
            **{k: j[k] for k in ("command", "agent", "since", "job")},
            as_=j["as"],
            host=host,
            # AGENT_UID/OPERATION: exact on the host even when two agents use the same operation ID.
            ref=f"{j['agent_uid']}/{j['operation_id']}" if j["operation_id"] else j["job"],
        )
        for j in panel.get("running") or []
    )
    return html(
        HOST,
        host=host,
        state=state,
        pending=panel["pending"],
        contact=when(panel.get("contact")),
        hold=held_text,
        hold_form=hold_form([host], held, "this host") if panel["state"] == "ok" else Markup(""),
        relay=relay_line(panel.get("relay")),
        collector=collector_line(panel.get("collector"), collector),
        jobs=jobs or html("<li>nothing running</li>"),
    )
