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
from airlock.common import arguments, render, shown
from airlock.common.render import Style, command_line, fields, sanitise, use_colour
from airlock.common.trail import outcome_words
from airlock.common.wire import operator as op


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


def _touch_text(touch: dict[str, Any]) -> str:
    """Issue 49: a passkey vote: who, with which credential, and the group one touch decided."""
    text = f"{touch.get('action')} by {touch.get('operator')}, method: passkey, credential {touch.get('credential_id')}"
    group = touch.get("group")
    if isinstance(group, dict):
        text += (
            f"; group: {group.get('hosts')} host(s), key {group.get('key')}, digest {group.get('digest')}, "
            f"this host's statement {group.get('member')}"
        )
    return text


def cmd_show(ns: argparse.Namespace) -> int:
    if getattr(ns, "output", False) or getattr(ns, "stdin", False):
        return _contents(ns)
    rc, data = _operator(ns, op.SHOW, op.Show(ns.ref))
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
    pairs += render.cwd_and_stdin(_where_and_input(data))  # issue 45: bound to the ticket, so shown
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
    for touch in decision.get("passkeys") or []:
        pairs.append(("passkey", sanitise(_touch_text(touch))))
    waiting = render.quorum_line(data.get("detail") or {}) if data.get("pending") else ""
    if waiting:
        pairs.append(("waiting", waiting))
    if data.get("pending") and data.get("expect"):
        pairs.append(("approve", approve_line(data.get("request_id"), data.get("expect"))))
    if outcome:
        pairs.append(("outcome", sanitise(outcome_words(outcome))))
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
    asked: dict[tuple[Any, Any], Any] = {}  # exec.started's line spells the command from request.received
    print("\n".join(_event_line(e, asked) for e in data.get("events") or []) or "(no journal events yet)")
    return 0


def _where_and_input(data: dict[str, Any]) -> dict[str, Any]:
    """Issue 45: what `render.cwd_and_stdin` reads: a pending request's detail, else the recorded request."""
    if data.get("pending") and isinstance(data.get("detail"), dict):
        return dict(data["detail"])
    request = data.get("request") or {}
    if "stages" not in request:
        return {}
    cwd = shown.cwd_line(request.get("cwd"), privileged=bool(request.get("privileged")))
    return {"cwd": cwd, "stdin": request.get("stdin"), "request": request}


def _contents(ns: argparse.Namespace) -> int:
    """``--output`` (issue 35: the job's stored output) or ``--stdin`` (issue 45)."""
    if getattr(ns, "output", False):
        from airlock.cli.output import cmd_output

        return cmd_output(ns)
    return _whole_stdin(ns)


def _whole_stdin(ns: argparse.Namespace) -> int:
    """``airlock show ID --stdin``: the whole stdin of a pending request (operators only): raw into a pipe or
    a file, escaped line by line (binary: in hex) on a terminal, where its bytes could repaint the screen."""
    rc, data = _operator(ns, op.SHOW, op.Show(ns.ref, stdin=True))
    if rc != 0 or ns.json:
        return rc
    data_bytes = shown.raw(data.get("stdin")) or b""
    print(
        f"# stdin of {sanitise(data.get('request_id'), strict=True)}: {shown.stdin_line(data.get('summary'))}",
        file=sys.stderr,
    )
    if not sys.stdout.isatty():
        sys.stdout.flush()
        sys.stdout.buffer.write(data_bytes)
        sys.stdout.buffer.flush()
        return 0
    excerpt = shown.excerpt_all(data_bytes)
    print("\n".join(sanitise(line) for line in excerpt))
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


def _tree_head(tree: dict[str, Any], count: int) -> list[str]:
    """The tree's first lines: how it was seen, whether it is complete and why not, what no mark covers."""
    scope = "the job's cgroups" if tree.get("scope") == "cgroup" else "descendants of the job's processes"
    if tree.get("source") == "fanotify":  # no fork or exit events: parents best effort, no ends
        scope += "; from fanotify exec opens, parents best effort"
    head = f"executed ({count} program{'s' if count != 1 else ''}, {scope}"
    if tree.get("complete", True):
        head += ")"
    else:  # issue 51: what the tree may lack, and why (a record from before says only that events were lost)
        given = tree.get("incomplete")
        why = [str(w) for w in given] if isinstance(given, list) else ["the kernel dropped events"]
        head += "; INCOMPLETE: " + "; ".join(sanitise(w) for w in why) + ")"
    if tree.get("unattributed"):  # fanotify: gone before their cgroup was read; maybe this job's, maybe not
        head += f"; {tree['unattributed']} exec(s) meanwhile ended too soon to tell whose"
    lines = [head]
    unwatched = tree.get("unwatched")
    if isinstance(unwatched, dict) and unwatched:  # fanotify: what no mark covers
        lines += [f"  not watched: {sanitise(str(k))}: {sanitise(str(v))}" for k, v in unwatched.items()]
    return lines


def tree_lines(tree: dict[str, Any]) -> list[str]:
    """The exec tree as `airlock show` prints it: one line per program, indented under the program that
    (directly or through forks that executed nothing) started it; every value sanitised."""
    if tree.get("unavailable"):
        return [f"executed: not recorded ({sanitise(tree['unavailable'])})"]
    procs = [p for p in tree.get("processes") or [] if isinstance(p, dict)]
    lines = _tree_head(tree, len(procs))
    children: dict[int | None, list[int]] = {}
    for i, p in enumerate(procs):
        parent = p.get("parent")
        children.setdefault(parent if isinstance(parent, int) and 0 <= parent < i else None, []).append(i)

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
            if p.get("unwatched"):  # issue 51: seen only through its interpreter's open
                text += " NOT WATCHED: its filesystem has no mark"
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
