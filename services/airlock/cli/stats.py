"""`airlock stats [--since 24h] [--json]`: how often airlock asks, who decides, and how fast (issue 34).

Computed here, from the journal's records as the operator door's events feed
gives them (like `airlock audit export`: root or an operator; the feed is
read oldest first, whole): requests by decision and by who decided (a rule,
a grant, an operator, a reviewer, the timeout, the agent withdrawing: the
``by`` of each ``approval.decided``, counted generically so a new kind of
decider shows up under its own name), asks (``approval.pending``) per hour,
the time from an ask to its decision (p50, p95, nearest rank), timeouts,
and the same per rule.  A request counts in the window when its decision
does; an ask when its ``approval.pending`` does.

`read_events` and `decider` are shared with `airlock policy suggest`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from airlock.cli.base import _err, _table
from airlock.common import client
from airlock.common.codec import parse_iso
from airlock.common.render import duration, sanitise
from airlock.common.validate import parse_duration

# ``by`` values that name no person: the decider's kind as the journal writes it.
_NOT_A_PERSON = {"policy": "rule", "grant": "grant", "timeout": "timeout", "agent": "agent"}


# What each rule's row counts (decisions, and asks).
_PER_RULE = ("requests", "allow", "deny", "timeout", "withdrawn", "asked")


def since_seconds(text: str) -> float | None:
    """--since: a duration (90s, 30m, 24h, 7d) or None if it is none."""
    try:
        return parse_duration(text)
    except ValueError:
        return None


def read_events(ns: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Every journal event through the operator door (None: said why on stderr)."""
    out: list[dict[str, Any]] = []
    try:
        for page in client.event_pages(client.operator_socket(ns.socket), timeout=None):
            out += [e for e in page if isinstance(e, dict)]
    except client.ClientError as exc:
        _err(str(exc))
        return None
    return out


def when(event: Mapping[str, Any]) -> float | None:
    """An event's time as Unix seconds (None if it has none that parses)."""
    return parse_iso(event.get("time"))


def decider(payload: Mapping[str, Any]) -> str:
    """Who decided, as a kind: rule, grant, timeout, agent, operator, or the first word of ``by``
    (``reviewer NAME`` is a reviewer)."""
    by = payload.get("by")
    if isinstance(by, str) and by in _NOT_A_PERSON:
        return _NOT_A_PERSON[by]
    if payload.get("decision") == "withdrawn":
        return "agent"
    if payload.get("operator_uid") is not None or payload.get("approvers"):
        return "operator"
    word = by.split()[0] if isinstance(by, str) and by.strip() else "unknown"
    return sanitise(word, strict=True)


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _key(event: Mapping[str, Any]) -> tuple[Any, Any]:
    """A request is its agent's uid and its request ID (each agent's IDs are its own)."""
    return event.get("peer_uid"), event.get("request_id")


def _spread(values: list[float]) -> dict[str, Any]:
    p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
    return {
        "count": len(values),
        "p50_seconds": None if p50 is None else round(p50, 3),
        "p95_seconds": None if p95 is None else round(p95, 3),
    }


def compute(events: Iterable[Mapping[str, Any]], now: float, window: float) -> dict[str, Any]:
    """The numbers for the ``window`` seconds up to ``now`` (pure: the tests feed it known sequences)."""
    start = now - window
    asked: dict[tuple[Any, Any], float] = {}
    decisions: Counter[str] = Counter()
    deciders: Counter[str] = Counter()
    hours: Counter[str] = Counter()
    waits: list[float] = []
    waits_by: dict[str, list[float]] = {}
    rules: dict[str, Counter[str]] = {}
    rule_by: dict[str, Counter[str]] = {}
    asks = 0
    for event in events:
        kind = event.get("kind")
        if kind not in ("approval.pending", "approval.decided"):
            continue
        at = when(event)
        payload = event.get("payload")
        if at is None or not isinstance(payload, Mapping):
            continue
        rule = sanitise(payload.get("rule") or "(none)", strict=True)
        if kind == "approval.pending":
            if payload.get("attached_to"):
                continue  # attached to an identical request pending already: no question of its own
            asked[_key(event)] = at
            if at >= start and at <= now:
                asks += 1
                hours[str(event.get("time"))[:13]] += 1
                rules.setdefault(rule, Counter())["asked"] += 1
            continue
        if at < start or at > now:
            continue
        decision = sanitise(payload.get("decision") or "unknown", strict=True)
        who = decider(payload)
        decisions[decision] += 1
        deciders[who] += 1
        per_rule = rules.setdefault(rule, Counter())
        per_rule["requests"] += 1
        per_rule[decision] += 1
        rule_by.setdefault(rule, Counter())[who] += 1
        since_ask = asked.get(_key(event))
        if since_ask is not None and decision in ("allow", "deny"):
            waits.append(at - since_ask)
            waits_by.setdefault(who, []).append(at - since_ask)
    hours_in_window = max(window / 3600.0, 1e-9)
    return {
        "since": now - window,
        "until": now,
        "window_seconds": window,
        "requests": sum(decisions.values()),
        "decisions": dict(sorted(decisions.items())),
        "by": dict(sorted(deciders.items())),
        "asks": {
            "total": asks,
            "per_hour": round(asks / hours_in_window, 2),
            "hours": {f"{h}:00Z": n for h, n in sorted(hours.items())},
        },
        "time_to_decision": _spread(waits) | {"by": {who: _spread(v) for who, v in sorted(waits_by.items())}},
        "timeouts": decisions.get("timeout", 0),
        "rules": {
            name: {k: c.get(k, 0) for k in _PER_RULE} | {"by": dict(sorted(rule_by.get(name, Counter()).items()))}
            for name, c in sorted(rules.items())
        },
    }


def _seconds(value: Any) -> str:
    if value is None:
        return "-"
    return f"{float(value):.1f}s" if float(value) < 120 else duration(float(value))


def render_text(numbers: Mapping[str, Any]) -> str:
    """The numbers as an operator reads them."""
    window = duration(float(numbers["window_seconds"]))
    lines = [f"requests decided in the last {window}: {numbers['requests']}"]
    decided = ", ".join(f"{k} {v}" for k, v in numbers["decisions"].items()) or "none"
    lines.append(f"  by decision: {decided}")
    lines.append(f"  by who decided: {', '.join(f'{k} {v}' for k, v in numbers['by'].items()) or 'none'}")
    asks = numbers["asks"]
    # The average is over the whole window, not the time the asks took (issue 44: 7 asks in 10 minutes
    # read "0.29 per hour"); the clock hours below say when they came.
    lines.append(
        f"asks (an operator was asked): {asks['total']}, "
        f"{asks['per_hour']:g} per hour on average over the last {window}"
    )
    for hour, count in asks["hours"].items():
        lines.append(f"  {hour}  {count}")
    wait = numbers["time_to_decision"]
    lines.append(
        f"time from an ask to a decision: p50 {_seconds(wait['p50_seconds'])}, "
        f"p95 {_seconds(wait['p95_seconds'])} ({wait['count']} decided)"
    )
    for who, spread in wait["by"].items():
        lines.append(
            f"  {who}: p50 {_seconds(spread['p50_seconds'])}, p95 {_seconds(spread['p95_seconds'])} ({spread['count']})"
        )
    lines.append(f"timeouts: {numbers['timeouts']}")
    rows = [
        [
            name,
            str(c.get("requests", 0)),
            str(c.get("allow", 0)),
            str(c.get("deny", 0)),
            str(c.get("asked", 0)),
            str(c.get("timeout", 0)),
            ", ".join(f"{k} {v}" for k, v in c["by"].items()),
        ]
        for name, c in numbers["rules"].items()
    ]
    if rows:
        lines.append("per rule:")
        lines.append(_table(rows, ["RULE", "DECIDED", "ALLOW", "DENY", "ASKED", "TIMEOUT", "DECIDED BY"]))
    return "\n".join(lines)


def cmd_stats(ns: argparse.Namespace) -> int:
    window = since_seconds(ns.since)
    if window is None:
        _err(f"stats: --since takes a duration like 24h or 7d (got {ns.since!r})")
        return 2
    events = read_events(ns)
    if events is None:
        return 1
    numbers = compute(events, time.time(), window)
    if ns.json:
        sys.stdout.write(json.dumps(numbers, indent=2, sort_keys=True) + "\n")
    else:
        print(render_text(numbers))
    return 0
