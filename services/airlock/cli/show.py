"""`airlock show REF`: one request's story as an operator reads it (issue 12's show, issue 35's tree and kill).

What was asked and by whom, the decision (rule, operator, grant and its use),
the run (exit, signal, the process tree the runner saw, who killed it), the
arguments approval bound, the reviewers' opinions and the passkeys that
signed; ``--output`` hands over to `cli/output`.  Split from `cli/operator`.
"""

from __future__ import annotations

import argparse
import pwd
import sys
from typing import Any

from airlock.cli.base import _operator
from airlock.cli.events import _event_line
from airlock.cli.operator import approve_line
from airlock.common import arguments, render
from airlock.common.render import Style, command_line, fields, sanitise, use_colour


def _decision_text(decision: dict[str, Any]) -> str:
    """`show`'s decision line: what, by whom (a grant and its use), the rule, the request decided with, why."""
    who = decision.get("by")
    if decision.get("grant_id"):
        who = f"grant {decision['grant_id']} (given by {decision.get('granted_by')})"
        if decision.get("grant_uses") is not None:
            who += f", use {decision.get('grant_use')} of {decision.get('grant_uses')}"
    text = f"{decision.get('decision')} by {who} (rule {decision.get('rule')})"
    if decision.get("decided_with"):
        text += f", decided with the identical request {decision['decided_with']}"
    if decision.get("reason"):
        text += f": {decision.get('reason')}"
    return text


def cmd_show(ns: argparse.Namespace) -> int:
    if getattr(ns, "output", False):
        from airlock.cli.output import cmd_output  # issue 35: the job's stored output

        return cmd_output(ns)
    rc, data = _operator(ns, "show", {"ref": ns.ref})
    if rc != 0 or ns.json:
        return rc
    style = Style(use_colour(sys.stdout))
    request = data.get("request") or {}
    peer = data.get("peer") or {}
    decision = data.get("decision") or {}
    outcome = data.get("outcome") or {}
    pairs: list[tuple[str, object]] = [
        ("request", sanitise(data.get("request_id"), strict=True)),
        ("operation", sanitise(data.get("operation_id") or "-", strict=True)),
        ("state", style.bold(sanitise(data.get("state")))),
        (
            "from",
            f"{sanitise(peer.get('user', '?'))} (uid {peer.get('uid', data.get('peer_uid'))}), pid "
            f"{peer.get('pid', '?')}",
        ),
        ("session", sanitise(data.get("session") or "-")),
        ("host", sanitise(request.get("host") or "-")),
        ("reason", sanitise(data.get("reason") or "-")),
        ("runs as", _runs_as(request)),
    ]
    for i, stage in enumerate(request.get("stages") or [], start=1):
        pairs.append((f"stage {i}", command_line(stage)))
    for line in arguments.flagged(_bound_arguments(data)):
        pairs.append((style.bold(arguments.FLAG), sanitise(line)))
    opinion = _opinion(data)
    if opinion:
        pairs.append(("reviewer", sanitise(render.reviewer_line(opinion).removeprefix("reviewer "))))
    given = _credential_names(data)
    if given:  # issue 35: what the job receives (or would), by name; never a value
        pairs.append(("credentials", sanitise(given)))
    if decision:
        pairs.append(("decision", sanitise(_decision_text(decision))))
    if decision.get("approvers"):
        pairs.append(
            (
                "approvers",
                sanitise(
                    ", ".join(
                        render.person(a, fingerprint=True)
                        if a.get("principal")
                        else f"{a.get('user')} (uid {a.get('uid')})"
                        for a in decision["approvers"]
                    )
                    + f" [{decision.get('quorum')}]"
                ),
            )
        )
    waiting = render.quorum_line(data.get("detail") or {}) if data.get("pending") else ""
    if waiting:
        pairs.append(("waiting", waiting))
    if data.get("pending") and data.get("expect"):
        pairs.append(("approve", approve_line(data.get("request_id"), data.get("expect"))))
    if outcome:
        text = f"{outcome.get('status')}"
        if outcome.get("exit_codes") is not None:
            text += f", exit codes {outcome.get('exit_codes')}"
        if outcome.get("code"):
            text += f", {outcome.get('code')}: {outcome.get('message')}"
        if outcome.get("timed_out"):
            text += ", timed out"
        if outcome.get("cancelled"):
            text += ", cancelled"
        text += _killed_text(outcome.get("killed") or {})
        pairs.append(("outcome", sanitise(text)))
    broken = data.get("lifecycle_error") or {}
    if broken:
        pairs.append(
            (
                "lifecycle",
                style.bold(
                    sanitise(
                        f"FORBIDDEN at seq {broken.get('seq')}: {broken.get('kind')} in state "
                        f"{broken.get('state')}: {broken.get('reason')}"
                    )
                ),
            )
        )
    print(fields(pairs))
    if isinstance(data.get("tree"), dict):
        print()
        print("\n".join(tree_lines(data["tree"])))
    print()
    print("\n".join(_event_line(e) for e in data.get("events") or []) or "(no journal events yet)")
    return 0


def _opinion(data: dict[str, Any]) -> Any:
    """Issue 34: the reviewer's opinion: from the pending entry, else from the request's journal records."""
    detail = data.get("detail") or {}
    if detail.get("reviewer"):
        return detail["reviewer"]
    for event in reversed(data.get("events") or []):
        payload = event.get("payload") if isinstance(event, dict) else None
        if event.get("kind") in ("approval.pending", "approval.decided") and isinstance(payload, dict):
            if isinstance(payload.get("reviewer"), dict):
                return payload["reviewer"]
    return None


def _credential_names(data: dict[str, Any]) -> str:
    """``stage 1: db`` for each stage given credentials: from the pending entry, else from ``exec.started``."""
    stages = (data.get("detail") or {}).get("credentials") or []
    if not any(stages):
        stages = []
        for event in data.get("events") or []:
            payload = event.get("payload") if isinstance(event, dict) else None
            if event.get("kind") == "exec.started" and isinstance(payload, dict):
                for item in payload.get("credentials") or []:
                    while len(stages) <= int(item.get("stage") or 0):
                        stages.append([])
                    stages[int(item.get("stage") or 0)].append(str(item.get("name")))
    return "; ".join(f"stage {i}: {', '.join(names)}" for i, names in enumerate(stages, start=1) if names)


def _killed_text(killed: dict[str, Any]) -> str:
    if not killed:
        return ""
    text = f", killed ({killed.get('signal')}) by {killed.get('by')}"
    return text + (f": {killed.get('reason')}" if killed.get("reason") else "")


def tree_lines(tree: dict[str, Any]) -> list[str]:
    """The exec tree as `airlock show` prints it: one line per program, indented under the program that
    (directly or through forks that executed nothing) started it; every value sanitised."""
    if tree.get("unavailable"):
        return [f"executed: not recorded ({sanitise(tree['unavailable'])})"]
    procs = [p for p in tree.get("processes") or [] if isinstance(p, dict)]
    scope = "the job's cgroups" if tree.get("scope") == "cgroup" else "descendants of the job's processes"
    if tree.get("source") == "fanotify":  # no fork or exit events: parents best effort, no ends
        scope += "; from fanotify exec opens, parents best effort"
    head = f"executed ({len(procs)} program{'s' if len(procs) != 1 else ''}, {scope}"
    head += ")" if tree.get("complete", True) else "; INCOMPLETE: the kernel dropped events)"
    if tree.get("unattributed"):  # fanotify: gone before their cgroup was read; maybe this job's, maybe not
        head += f"; {tree['unattributed']} exec(s) meanwhile ended too soon to tell whose"
    children: dict[int | None, list[int]] = {}
    for i, p in enumerate(procs):
        parent = p.get("parent")
        children.setdefault(parent if isinstance(parent, int) and 0 <= parent < i else None, []).append(i)
    lines = [head]

    def line(i: int, depth: int) -> None:
        p = procs[i]
        argv = p.get("argv")
        shown = command_line([str(a) for a in argv]) if isinstance(argv, list) else "?"
        if p.get("argv_truncated"):
            shown += " …"
        ident = p.get("exe_id") or {}
        text = f"{'  ' * depth}{p.get('pid')} {shown}"
        if p.get("exited_before_read"):
            text += "  [exited before it could be read"
            if p.get("comm"):  # the kernel's accounting record: its name and file, no path
                text += f"; was {sanitise(p.get('comm'), strict=True)} dev {ident.get('dev')} ino {ident.get('ino')}"
                text += f" uid {p.get('uid')}"
            elif p.get("exe"):  # fanotify: the file from the event itself
                text += f"; was {sanitise(p.get('exe'), strict=True)} dev {ident.get('dev')} ino {ident.get('ino')}"
            text += "]"
        else:
            text += f"  [{sanitise(p.get('exe'), strict=True)} dev {ident.get('dev')} ino {ident.get('ino')}"
            if p.get("interpreter"):
                text += f" via {sanitise(p.get('interpreter'), strict=True)}"
            if "uid" in p:
                text += f" uid {p.get('uid')}" + (f" euid {p.get('euid')}" if p.get("euid") != p.get("uid") else "")
            if p.get("signal"):
                text += f" signal {p.get('signal')}"
            elif p.get("exit_code") is not None:
                text += f" exit {p.get('exit_code')}"
            text += "]"
        lines.append(text)
        for c in children.get(i, []):
            line(c, depth + 1)

    for root in children.get(None, []):
        line(root, 1)
    if tree.get("more"):
        lines.append(f"  … {tree['more']} more (runner.exec_tree_max is {tree.get('limit')})")
    return lines


def _runs_as(request: dict[str, Any]) -> str:
    """Whom the job runs as: root, another account (issue 48: the spec's ``user``), or the requester."""
    other = request.get("user")
    if isinstance(other, int) and not isinstance(other, bool):
        try:
            name = pwd.getpwuid(other).pw_name
        except (KeyError, OverflowError):
            name = str(other)
        return f"{sanitise(name)} (uid {other}, privileged: another account)"
    return "root (privileged)" if request.get("privileged") else "the requesting user"


def _bound_arguments(data: dict[str, Any]) -> Any:
    """A request's changeable path arguments: from the pending entry, else from its approval.pending record."""
    detail = data.get("detail") or {}
    if detail.get("arguments"):
        return detail["arguments"]
    for event in data.get("events") or []:
        payload = event.get("payload") if isinstance(event, dict) else None
        if event.get("kind") == "approval.pending" and isinstance(payload, dict) and payload.get("arguments"):
            return payload["arguments"]
    return []
