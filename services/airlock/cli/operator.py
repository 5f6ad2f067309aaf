"""The operator's commands on operator.sock: status, pending, approve/deny, grants, statement, hold, release,
cancel, kill, wait, watch (show is `cli/show`)."""

from __future__ import annotations

import argparse
import json
import select
import sys
import time
from pathlib import Path
from typing import Any

from airlock.cli.base import _err, _operator, _table, _unreachable
from airlock.common import arguments, client, render, sandbox
from airlock.common.codec import iso_utc
from airlock.common.render import Style, command_line, fields, sanitise, use_colour
from airlock.common.wire import operator as op
from airlock.common.wire.verb import Empty
from airlock.relay import state as relay_state

# `airlock wait` on an operation the journal does not know yet keeps asking this long.
UNKNOWN_GRACE_SECONDS = 10.0


def cmd_status(ns: argparse.Namespace) -> int:
    try:
        raw, reply = client.call(client.operator_socket(ns.socket), op.STATUS, Empty())
    except client.ClientError as exc:
        _unreachable(ns, exc)
        return 1
    if not reply.get("ok"):
        if ns.json:
            sys.stdout.buffer.write(raw + b"\n")
        else:
            error = reply.get("error") or {}
            _err(f"{error.get('code')}: {error.get('message')}")
        return 1
    rc, data = 0, dict(reply.get("data") or {})
    # The relay's part is read here, on this host (relay/state.py says why).
    data["relay"] = relay_status(data.get("relay"), time.time())
    if ns.json:
        print(json.dumps(reply | {"data": data}, separators=(",", ":")))
        return rc
    if rc == 0:
        hold = "accepting"
        if data.get("hold"):
            who = f" by {sanitise(data.get('hold_by'))}" if data.get("hold_by") else ""
            since = f" since {sanitise(data.get('hold_since'))}" if data.get("hold_since") else ""
            hold = f"on hold{who}{since} ({sanitise(data.get('hold_reason'))})"
        policy = data.get("policy", {})
        services = data.get("services") or {}
        pairs: list[tuple[str, object]] = [
            ("state", hold),
            ("pending", data.get("pending")),
            ("tokens", f"{data.get('tokens', 0)} live"),
            ("grants", f"{data.get('grants', 0)} live"),
            ("policy", f"default {policy.get('default')}, {policy.get('rules')} rule(s)"),
        ]
        if data.get("config_refused"):  # issue 44: airlock.yaml was refused; approval runs on a kept copy
            pairs.append(("config", f"REFUSED: {sanitise(data['config_refused'])}"))
        said = (policy.get("standing") or {}).get("sentence")
        if said:  # issue 44: the files on disk were refused
            pairs.append(("  REFUSED", sanitise(said)))
            pairs += [("  error", sanitise(e)) for e in (policy.get("standing") or {}).get("refused", [])[:20]]
        for name, info in sorted(services.items()):
            # The chain's head: every event ever journaled, sealed segments too (the disk line counts the live one's).
            extra = f", {info['events']} events journaled (head seq)" if "events" in info else ""
            pairs.append((name, f"{info.get('state')}{extra}"))
            if name == "journal" and isinstance(info.get("disk"), dict):
                pairs += disk_lines(info["disk"])
        pairs += relay_lines(data["relay"])
        print(fields(pairs))
    return rc


def _size(n: object) -> str:
    value = float(n) if isinstance(n, int | float) else 0.0
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def disk_lines(disk: dict[str, Any]) -> list[tuple[str, object]]:
    """The journal's disk as `airlock status` shows it (journal/disk.py measures it)."""
    if disk.get("error"):
        return [("  disk", f"unknown: {sanitise(str(disk['error']))}")]
    rate = disk.get("bytes_per_day")
    days = disk.get("days_left")
    growth = (
        f"growing {_size(rate)}/day, full in ~{days:,.0f} day(s) at that rate"
        if isinstance(rate, int | float) and rate > 0 and isinstance(days, int | float)
        else "growth rate not known yet (under an hour of records)"
        if rate is None
        else "not growing"
    )
    free = (
        f"{_size(disk.get('free_bytes'))} free of {_size(disk.get('filesystem_bytes'))} ({disk.get('free_percent')}%)"
    )
    if disk.get("low"):
        free += (
            f"; LOW: under journal.disk_warn_percent {disk.get('warn_percent')}% or "
            f"journal.disk_warn_bytes {_size(disk.get('warn_bytes'))}"
        )
    return [
        ("  size", f"{_size(disk.get('journal_bytes'))} with sealed segments, {disk.get('records')} in the live one"),
        ("  segment", sanitise(str(disk.get("segment")))),
        ("  free", free),
        ("  growth", growth),
    ]


def relay_status(hint: object, now: float) -> dict[str, Any]:
    """The relay as `airlock status` shows it: approval says where it reports, its status file says the rest."""
    if not isinstance(hint, dict) or not isinstance(hint.get("state_dir"), str):
        return {"state": "unknown"}
    configured = [str(c) for c in hint.get("channels") or []]
    body = relay_state.read(Path(hint["state_dir"]))
    if body is None:
        state = "not running" if configured else "not configured"
        return {"state": state, "configured": configured, "channels": []} | _wait(hint)
    if "error" in body and "state" not in body:
        return {"state": "unknown", "error": body["error"], "configured": configured, "channels": []} | _wait(hint)
    running = relay_state.running(body, now)
    channels = [c for c in body.get("channels") or [] if isinstance(c, dict)]
    return {
        "state": "running" if running else "not running",
        "pid": body.get("pid") if running else None,
        "updated": body.get("updated"),
        "journal_latest": body.get("journal_latest"),
        "configured": configured,
        "channels": channels,
    } | _wait(hint)


def _wait(hint: dict[str, Any]) -> dict[str, Any]:
    """Approval's wait for a person as approval has it: 600 s once notify.channels is set, said (issue 44)."""
    return {k: hint.get(k) for k in ("approval_timeout_seconds", "approval_timeout_why") if k in hint}


def relay_lines(relay: dict[str, Any]) -> list[tuple[str, object]]:
    state = relay.get("state")
    if state == "not configured":
        return [("relay", "not configured (notify.channels is empty)")]
    line = str(state)
    if state == "running":
        line += f" (pid {relay.get('pid')})"
    elif isinstance(relay.get("updated"), int | float):
        line += f" (last report {iso_utc(relay['updated'], timespec='seconds')})"
    if relay.get("error"):
        line += f": {sanitise(relay['error'])}"
    pairs: list[tuple[str, object]] = [("relay", line)]
    for c in relay.get("channels") or []:
        delivered = c.get("delivered_seq")
        text = f"delivered up to event {delivered}" if delivered is not None else "nothing delivered yet"
        text += f", lag {c.get('lag')} event(s)" if c.get("lag") is not None else ""
        text += f", {c.get('queued')} queued" if c.get("queued") else ""
        if c.get("failing_since"):
            text += f"; FAILING since {sanitise(c['failing_since'])} ({c.get('failures')} failed tries)"
        if c.get("last_error"):
            text += f"; last error {sanitise(c.get('last_error_at'))}: {sanitise(c['last_error'])}"
        pairs.append((f"  {sanitise(c.get('name'), strict=True)}", text))
    wait, why = relay.get("approval_timeout_seconds"), relay.get("approval_timeout_why")
    if isinstance(wait, int | float) and why:
        pairs.append(("  approval wait", f"{wait:g} s for an operator: {sanitise(why)}"))
    return pairs


def cmd_pending(ns: argparse.Namespace) -> int:
    rc, data = _operator(ns, op.PENDING, Empty())
    if rc == 0 and not ns.json:
        if data.get("policy_note"):  # issue 44: the policy files were refused; what decides instead
            print(f"policy: {render.sanitise(data['policy_note'])}")
        rows = []
        # Issue 34: an attached request is decided with its first; it is named on the first's line only.
        data["pending"] = [p for p in data.get("pending", []) if not p.get("attached_to")]
        for p in data.get("pending", []):
            spec = p["request"].get("spec", {})
            command = " | ".join(command_line(stage) for stage in spec.get("stages", []))
            command = command or f"{p['request'].get('tool', '')} {p['request'].get('path', '')}"  # a file operation
            as_user = (p.get("run_as") or {}).get("user") or ("root" if p.get("privileged") else "user")
            rows.append([p["request_id"], p["peer"]["user"], as_user, render.duration(p["seconds_left"]), command[:60]])
        print(_table(rows, ["ID", "USER", "AS", "LEFT", "COMMAND"]) if rows else "no pending requests")
        for p in data.get("pending", []):
            # Issue 27: the exact line that decides this request and no other.
            print(f"{render.sanitise(p['request_id'], strict=True)}: {approve_line(p['request_id'], p.get('expect'))}")
        for p in data.get("pending", []):
            extra = render.quorum_line(p)
            if extra:
                print(f"{render.sanitise(p['request_id'], strict=True)} {extra}")
            attached = [render.sanitise(a, strict=True) for a in p.get("attached") or []]
            if attached:  # issue 34: identical requests of the same agent, decided with it
                print(f"{render.sanitise(p['request_id'], strict=True)} also decides: {', '.join(attached)}")
        for p in data.get("pending", []):
            for line in arguments.flagged(p.get("arguments")):  # issue 27: others can change what it reads
                print(f"{render.sanitise(p['request_id'], strict=True)} {arguments.FLAG}: {render.sanitise(line)}")
            if p.get("reviewer"):  # issue 34: the reviewer's opinion, escaped like every request value
                opinion = render.sanitise(render.reviewer_line(p["reviewer"]))
                print(f"{render.sanitise(p['request_id'], strict=True)} {opinion}")
            if p.get("sandbox"):  # shown only when a rule confines the job; none means a full job
                confined = "; ".join(f"stage {i}: {sandbox.describe(sb)}" for i, sb in enumerate(p["sandbox"], start=1))
                print(f"{render.sanitise(p['request_id'], strict=True)} sandbox: {render.sanitise(confined)}")
            if any(p.get("credentials") or []):  # issue 35: what the job would receive (names only)
                given = "; ".join(
                    f"stage {i}: {', '.join(names)}" for i, names in enumerate(p["credentials"], start=1) if names
                )
                print(f"{render.sanitise(p['request_id'], strict=True)} credentials: {render.sanitise(given)}")
            for label, value in render.cwd_and_stdin(p):  # issue 45: bound to the ticket, so shown
                print(f"{render.sanitise(p['request_id'], strict=True)} {label.strip()}: {value}")
            review = render.file_review(p["request"])
            if review:
                print(f"\n{render.sanitise(p['request_id'], strict=True)}:")
                print(render.fields(review))
            if p["request"].get("diff"):
                # The diff shows file content, which the agent may have chosen: sanitised like the rest.
                print(
                    f"{render.sanitise(p['request'].get('tool'), strict=True)} would change "
                    f"{render.sanitise(p['request'].get('path'), strict=True)}:"
                )
                print(render.diff_lines(p["request"]["diff"]), end="")
    return rc


def approve_line(request_id: object, expect: object, verb: str = "approve") -> str:
    """The line that decides exactly this pending request (issue 27): whole ID, quoted, and its --expect."""
    options = ("--expect", sanitise(expect, strict=True)) if isinstance(expect, str) and expect else ()
    return render.decision_line(verb, sanitise(request_id, strict=True), options=options)


def _confirmed(ns: argparse.Namespace) -> tuple[str, str] | None:
    """On a terminal without --expect: find what the person typed (the whole ID or a unique prefix of a
    pending request, `show`), show it, and ask; the answer acts on that exact ID and its digest only."""
    from airlock.cli import watch

    quiet = argparse.Namespace(**{**vars(ns), "json": False})
    rc, data = _operator(quiet, op.SHOW, op.Show(ns.id))
    if rc != 0:
        return None
    request_id = str(data.get("request_id") or "")
    if not request_id.startswith(ns.id):
        _err(f"{sanitise(ns.id, strict=True)} is not a request ID: give the request ID, not an operation ID")
        return None
    if not data.get("pending"):
        _err(f"{sanitise(request_id, strict=True)} is no longer pending ({sanitise(data.get('state'))})")
        return None
    detail = data.get("detail") or {}
    print(watch.describe(detail, Style(use_colour(sys.stdout)), 1, 1))
    left = float(detail.get("seconds_left") or 0)
    sys.stdout.write(f"\n{ns.verb} {sanitise(request_id, strict=True)}? [y/N] ")
    sys.stdout.flush()
    ready, _, _ = select.select([sys.stdin], [], [], max(1.0, left))  # it stops waiting then anyway
    answer = sys.stdin.readline().strip().lower() if ready else ""
    if answer not in ("y", "yes"):
        _err("nothing decided" + ("" if ready else " (no answer before the request expired)"))
        return None
    return request_id, str(data.get("expect") or "")


def cmd_decide(ns: argparse.Namespace) -> int:
    if ns.expect is None and not ns.yes and not ns.json and sys.stdin.isatty() and sys.stdout.isatty():
        found = _confirmed(ns)
        if found is None:
            return 1
        ns.id, ns.expect = found
    args: dict[str, Any] = {"id": ns.id}
    if ns.expect:
        args["expect"] = ns.expect
    if ns.reason:
        args["reason"] = ns.reason
    if getattr(ns, "principal", None):
        args["principal"] = ns.principal
    granting = _grant_args(ns)
    if granting is None:
        return 2
    args |= granting
    if getattr(ns, "signature", None) or getattr(ns, "sign", None):
        from airlock.cli import signing

        try:
            if ns.signature:
                args["signature"] = signing.read_signature_file(ns.signature)
            else:
                args["signature"] = signing.sign(ns, _operator, "allow" if ns.verb == "approve" else "deny")
        except signing.SigningError as exc:
            _err(str(exc))
            return 1
    rc, data = _operator(ns, op.APPROVE if ns.verb == "approve" else op.DENY, op.Decision(**args))
    if rc == 0 and not ns.json:
        outcome = "approved" if data.get("decision") == "allow" else "denied"
        if data.get("decision") == "allow" and data.get("complete") is False:
            outcome = f"approval counted ({sanitise(data.get('progress'))}); waiting for more approvers"
        elif data.get("needed", 1) > 1:
            outcome += f" ({sanitise(data.get('progress'))})"
        grant = data.get("grant") or {}
        if grant:
            outcome += (
                f"; grant {sanitise(grant.get('grant_id'), strict=True)} ({sanitise(grant.get('scope'))})"
                f" until {iso_utc(float(grant.get('expires') or 0), timespec='seconds')}"
                + (f", {int(grant['uses'])} uses" if isinstance(grant.get("uses"), int) else "")
            )
        signer = data.get("signer") or {}
        if signer.get("principal"):
            outcome += f" signed by {sanitise(signer['principal'])} ({sanitise(signer.get('fingerprint'))})"
        print(f"{sanitise(data.get('request_id'), strict=True)}: {outcome}")
    return rc


def _grant_args(ns: argparse.Namespace) -> dict[str, Any] | None:
    """approve's --grant, --scope and --uses as arguments (None: a usage error, said)."""
    if getattr(ns, "grant", None):
        from airlock.common.validate import parse_duration

        try:
            args: dict[str, Any] = {"grant_seconds": parse_duration(ns.grant), "scope": ns.scope}
        except ValueError as exc:
            _err(f"--grant: {exc}")
            return None
        if getattr(ns, "uses", None) is not None:
            args["uses"] = ns.uses
        return args
    if getattr(ns, "scope", None) and ns.scope != "command":
        _err("--scope needs --grant")
        return None
    if getattr(ns, "uses", None) is not None:
        _err("--uses needs --grant")
        return None
    return {}


def cmd_grants(ns: argparse.Namespace) -> int:
    if ns.action == "revoke":
        if not ns.grant_id:
            _err("grants revoke needs a GRANT_ID")
            return 2
        args: dict[str, Any] = {"grant_id": ns.grant_id}
        if ns.reason:
            args["reason"] = ns.reason
        rc, done = _operator(ns, op.GRANT_REVOKE, op.GrantRevoke(**args))
        if rc == 0 and not ns.json:
            # the whole ID the prefix named, so the person sees which grant ended
            revoked = done.get("grant_id")
            print(f"{sanitise(revoked if isinstance(revoked, str) else ns.grant_id, strict=True)}: revoked")
        return rc
    rc, data = _operator(ns, op.GRANTS, Empty())
    if rc == 0 and not ns.json:
        rows = [
            [
                g["grant_id"],
                str(g["uid"]) + (f"/{g['session']}" if g.get("session") else ""),
                g["scope"],
                g["rule"] if g["scope"] == "rule" else g["command"][:50],
                g["made_by"],
                render.duration(g["seconds_left"]),
                # issue 34: "1 of 2" uses left, or "-" for a grant bounded by time alone
                f"{g['uses_left']} of {g['uses']}" if isinstance(g.get("uses"), int) else "-",
            ]
            for g in data.get("grants", [])
        ]
        print(
            _table(
                [[sanitise(c) for c in r] for r in rows],
                ["GRANT", "UID/SESSION", "SCOPE", "COVERS", "BY", "LEFT", "USES LEFT"],
            )
            if rows
            else "no live grants"
        )
    return rc


def cmd_statement(ns: argparse.Namespace) -> int:
    args = op.Statement(ns.id, ns.expect or None, "deny" if ns.deny else "allow")
    rc, data = _operator(ns, op.STATEMENT, args)
    if rc == 0 and not ns.json:
        # Exactly the bytes to sign: nothing before or after.
        sys.stdout.write(data.get("statement") or "")
        sys.stdout.flush()
        if data.get("signatures") is False:
            _err("note: signed approvals are off on this host (no approval.allowed_signers file)")
        elif sys.stderr.isatty():
            _err(f"sign it with: {data.get('sign_command')}")
    return rc


def cmd_hold(ns: argparse.Namespace) -> int:
    rc, _ = _operator(ns, op.HOLD, op.Hold(ns.reason))
    if rc == 0 and not ns.json:
        print("on hold: every request now waits for an operator")
    return rc


def cmd_release(ns: argparse.Namespace) -> int:
    rc, data = _operator(ns, op.RELEASE, Empty())
    if rc == 0 and not ns.json:
        went = [sanitise(r) for r in data.get("released") or []]
        print("released" + (f"; their rules allow, so these run now: {', '.join(went)}" if went else ""))
    return rc


def cmd_cancel(ns: argparse.Namespace) -> int:
    args: dict[str, Any] = {"operation_id": ns.operation_id}
    if ns.reason:
        args["reason"] = ns.reason
    rc, data = _operator(ns, op.CANCEL, op.Cancel(**args))
    if rc == 0 and not ns.json:
        print(f"{sanitise(ns.operation_id, strict=True)}: cancelling ({data.get('was')})")
    return rc


def cmd_kill(ns: argparse.Namespace) -> int:
    args: dict[str, Any] = {"ref": ns.ref}
    if ns.signal:
        args["signal"] = ns.signal
    if ns.reason:
        args["reason"] = ns.reason
    rc, data = _operator(ns, op.KILL, op.Kill(**args))
    if rc == 0 and not ns.json:
        print(
            f"{sanitise(data.get('request_id') or data.get('operation_id'), strict=True)}: "
            f"{sanitise(data.get('signal'))} sent ({sanitise(data.get('was'))})"
        )
    return rc


def cmd_wait(ns: argparse.Namespace) -> int:
    """Block until the operation settles; 0 only when it ran and its last stage exited 0."""
    started = time.monotonic()
    path = client.operator_socket(ns.socket)
    while True:
        try:
            raw, reply = client.call(path, op.SHOW, op.Show(ns.operation_id), timeout=30)
        except client.ClientError as exc:
            _unreachable(ns, exc)
            return 1
        waited = time.monotonic() - started
        error = reply.get("error") or {}
        if reply.get("ok") and (reply.get("data") or {}).get("settled"):
            data = reply["data"]
            if ns.json:
                sys.stdout.buffer.write(raw + b"\n")
            else:
                from airlock.common.trail import outcome_words  # as `show` says it (issue 44)

                detail = outcome_words(data["outcome"]) if data.get("outcome") else None
                print(f"{sanitise(ns.operation_id, strict=True)}: {sanitise(data.get('state'))} ({sanitise(detail)})")
            from airlock.common.trail import ran_and_succeeded

            return 0 if ran_and_succeeded(data) else 1
        if not reply.get("ok") and not (error.get("code") == "not_found" and waited < UNKNOWN_GRACE_SECONDS):
            if ns.json:
                sys.stdout.buffer.write(raw + b"\n")
            else:
                _err(f"{error.get('code')}: {error.get('message')}")
            return 1
        if ns.timeout is not None and waited >= ns.timeout:
            _err(f"wait: {ns.operation_id} did not settle within {ns.timeout:g}s")
            return 1
        time.sleep(ns.interval)


def cmd_watch(ns: argparse.Namespace) -> int:
    from airlock.cli import watch

    if getattr(ns, "watch_hosts", None):
        from airlock.cli import remote

        return remote.watch_hosts(ns.watch_hosts, ns.watch_ssh_config)
    return watch.watch(client.operator_socket(ns.socket))
