"""The `airlock` command: a thin client of the two front doors.

Agents use `airlock run` (agent.sock); operators use the other commands
(operator.sock).  ``--json`` prints the daemon's envelope verbatim.  Exit
codes for operator commands: 0 success, 1 a daemon error or negative outcome,
2 usage.  `airlock run` exits with the command's own code (see its help).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airlock import __version__

# Only what every command needs is imported here: `airlock run` is on an
# agent's hot path, and each command imports the rest when it runs.
from airlock.cli import fleet
from airlock.common import client, render, sandbox
from airlock.common.codec import iso_utc
from airlock.common.render import Style, command_line, fields, sanitise, use_colour
from airlock.gateway import cli as gateway_cli
from airlock.mcp import cli as mcp_cli

EXIT_DENIED = 126
EXIT_APPROVAL_TIMEOUT = 124
EXIT_AIRLOCK_ERROR = 125
# `airlock wait` on an operation the journal does not know yet keeps asking this long.
UNKNOWN_GRACE_SECONDS = 10.0


def _unreachable(ns: argparse.Namespace, exc: client.ClientError) -> None:
    """The daemon could not be reached: say so, and with --json as an envelope too.

    reference/004's closed list has `daemon_unavailable` for this; a script
    that parses the --json output gets an envelope to read instead of nothing.
    """
    _err(str(exc))
    if getattr(ns, "json", False):
        error = {"code": "daemon_unavailable", "message": str(exc), "details": {}}
        sys.stdout.write(json.dumps({"id": None, "ok": False, "error": error}, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def _err(message: str) -> None:
    print(f"airlock: {message}", file=sys.stderr)


# --- airlock run ------------------------------------------------------------------


def cmd_run(ns: argparse.Namespace) -> int:
    if not ns.command:
        _err("run: give a command after --, e.g. airlock run -- systemctl status nginx")
        return 2
    args: dict[str, Any] = {
        "argv": ns.command,
        "privileged": not ns.no_privilege,
        "time": iso_utc(),
    }
    for key in ("reason", "session", "cwd"):
        if getattr(ns, key):
            args[key] = getattr(ns, key)
    if ns.timeout:
        args["timeout_ms"] = int(ns.timeout * 1000)
    if ns.env:
        env = {}
        for item in ns.env:
            name, sep, value = item.partition("=")
            if not sep:
                _err(f"run: --env takes NAME=VALUE (got {item!r})")
                return 2
            env[name] = value
        args["env"] = env
    # Each `airlock run` is a new intent: without --operation-id it gets an ID
    # of its own, so typing the same command twice runs it twice instead of
    # replaying the first outcome (the protocol's derived IDs suit retries).
    args["operation_id"] = ns.operation_id or f"cli-{uuid.uuid4()}"
    args["stream"] = True
    noticed = False

    def on_event(_raw: bytes, event: dict[str, Any]) -> None:
        nonlocal noticed
        if event.get("event") == "pending_approval" and not noticed and not ns.json:
            noticed = True
            wait = event.get("timeout_seconds")
            _err(f"waiting for an operator to approve (rule {event.get('rule')!r}, up to {wait}s)")

    try:
        token = ns.token or os.environ.get("AIRLOCK_TOKEN") or None
        raw, reply = client.call(client.agent_socket(ns.socket), "exec", args, on_event=on_event, token=token)
    except client.ClientError as exc:
        _unreachable(ns, exc)
        return EXIT_AIRLOCK_ERROR
    if ns.json:
        sys.stdout.buffer.write(raw + b"\n")
        sys.stdout.flush()
    if not reply.get("ok"):
        error = reply.get("error") or {}
        code = error.get("code")
        if not ns.json:
            _err(f"{code}: {error.get('message')}")
        if code == "denied":
            return EXIT_DENIED
        if code == "approval_timeout":
            return EXIT_APPROVAL_TIMEOUT
        return EXIT_AIRLOCK_ERROR
    data = reply.get("data") or {}
    if not ns.json:
        for stage in data.get("stages", []):
            sys.stderr.buffer.write(base64.b64decode(stage.get("stderr") or ""))
        sys.stderr.flush()
        sys.stdout.buffer.write(base64.b64decode(data.get("stdout") or ""))
        sys.stdout.flush()
        if data.get("timed_out"):
            _err(f"the command timed out ({data.get('timeout_reason')})")
    return exit_status(data)


def exit_status(evidence: dict[str, Any]) -> int:
    """The last stage's exit code, or 128+N for signal N (as a shell reports it)."""
    stages = evidence.get("stages") or [{}]
    last = stages[-1]
    if isinstance(last.get("signal"), int) and last.get("exit_code") is None:
        return 128 + int(last["signal"])
    code = last.get("exit_code")
    return int(code) if isinstance(code, int) else EXIT_AIRLOCK_ERROR


# --- operator commands ------------------------------------------------------------


def _operator(ns: argparse.Namespace, verb: str, args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    try:
        raw, reply = client.call(client.operator_socket(ns.socket), verb, args)
    except client.ClientError as exc:
        _unreachable(ns, exc)
        return 1, {}
    if ns.json:
        sys.stdout.buffer.write(raw + b"\n")
        sys.stdout.flush()
    if not reply.get("ok"):
        error = reply.get("error") or {}
        if not ns.json:
            # The operator door keeps to reference/004's codes; the precise one is in details.reason.
            precise = (error.get("details") or {}).get("reason")
            code = f"{error.get('code')} ({precise})" if isinstance(precise, str) else error.get("code")
            _err(f"{code}: {error.get('message')}")
        return 1, {}
    return 0, reply.get("data") or {}


def _table(rows: list[list[str]], header: list[str]) -> str:
    return render.table(rows, header)


def cmd_status(ns: argparse.Namespace) -> int:
    rc, data = _operator(ns, "status", {})
    if rc == 0 and not ns.json:
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
        for name, info in sorted(services.items()):
            extra = f", {info['events']} events" if "events" in info else ""
            pairs.append((name, f"{info.get('state')}{extra}"))
        print(fields(pairs))
    return rc


def cmd_pending(ns: argparse.Namespace) -> int:
    rc, data = _operator(ns, "pending", {})
    if rc == 0 and not ns.json:
        rows = []
        for p in data.get("pending", []):
            spec = p["request"].get("spec", {})
            command = " | ".join(command_line(stage) for stage in spec.get("stages", []))
            command = command or f"{p['request'].get('tool', '')} {p['request'].get('path', '')}"  # a file operation
            as_user = (p.get("run_as") or {}).get("user") or ("root" if p.get("privileged") else "user")
            rows.append([p["request_id"], p["peer"]["user"], as_user,
                         render.duration(p["seconds_left"]), command[:60]])
        print(_table(rows, ["ID", "USER", "AS", "LEFT", "COMMAND"]) if rows else "no pending requests")
        for p in data.get("pending", []):
            extra = render.quorum_line(p)
            if extra:
                print(f"{render.sanitise(p['request_id'], strict=True)} {extra}")
        for p in data.get("pending", []):
            if p.get("sandbox"):  # shown only when a rule confines the job; none means a full job
                confined = "; ".join(f"stage {i}: {sandbox.describe(sb)}" for i, sb in enumerate(p["sandbox"], start=1))
                print(f"{render.sanitise(p['request_id'], strict=True)} sandbox: {render.sanitise(confined)}")
            review = render.file_review(p["request"])
            if review:
                print(f"\n{render.sanitise(p['request_id'], strict=True)}:")
                print(render.fields(review))
            if p["request"].get("diff"):
                # The diff shows file content, which the agent may have chosen: sanitised like the rest.
                print(f"{render.sanitise(p['request'].get('tool'), strict=True)} would change "
                      f"{render.sanitise(p['request'].get('path'), strict=True)}:")
                print(render.diff_lines(p["request"]["diff"]), end="")
    return rc


def cmd_decide(ns: argparse.Namespace) -> int:
    args: dict[str, Any] = {"id": ns.id}
    if ns.reason:
        args["reason"] = ns.reason
    if getattr(ns, "principal", None):
        args["principal"] = ns.principal
    if getattr(ns, "grant", None):
        from airlock.common.validate import parse_duration

        try:
            args["grant_seconds"] = parse_duration(ns.grant)
        except ValueError as exc:
            _err(f"--grant: {exc}")
            return 2
        args["scope"] = ns.scope
    elif getattr(ns, "scope", None) and ns.scope != "command":
        _err("--scope needs --grant")
        return 2
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
    rc, data = _operator(ns, ns.verb, args)
    if rc == 0 and not ns.json:
        outcome = "approved" if data.get("decision") == "allow" else "denied"
        if data.get("decision") == "allow" and data.get("complete") is False:
            outcome = f"approval counted ({data.get('progress')}); waiting for more approvers"
        elif data.get("needed", 1) > 1:
            outcome += f" ({data.get('progress')})"
        grant = data.get("grant") or {}
        if grant:
            outcome += (f"; grant {sanitise(grant.get('grant_id'), strict=True)} ({sanitise(grant.get('scope'))})"
                        f" until {iso_utc(float(grant.get('expires') or 0), timespec='seconds')}")
        signer = data.get("signer") or {}
        if signer.get("principal"):
            outcome += f" signed by {sanitise(signer['principal'])} ({sanitise(signer.get('fingerprint'))})"
        print(f"{data.get('request_id')}: {outcome}")
    return rc


def cmd_grants(ns: argparse.Namespace) -> int:
    if ns.action == "revoke":
        if not ns.grant_id:
            _err("grants revoke needs a GRANT_ID")
            return 2
        args: dict[str, Any] = {"grant_id": ns.grant_id}
        if ns.reason:
            args["reason"] = ns.reason
        rc, _ = _operator(ns, "grant.revoke", args)
        if rc == 0 and not ns.json:
            print(f"{ns.grant_id}: revoked")
        return rc
    rc, data = _operator(ns, "grants", {})
    if rc == 0 and not ns.json:
        rows = [[g["grant_id"], str(g["uid"]) + (f"/{g['session']}" if g.get("session") else ""), g["scope"],
                 g["rule"] if g["scope"] == "rule" else g["command"][:50], g["made_by"], render.duration(g["seconds_left"])]
                for g in data.get("grants", [])]
        print(_table([[sanitise(c) for c in r] for r in rows], ["GRANT", "UID/SESSION", "SCOPE", "COVERS", "BY", "LEFT"])
              if rows else "no live grants")
    return rc


def cmd_statement(ns: argparse.Namespace) -> int:
    rc, data = _operator(ns, "statement", {"id": ns.id, "decision": "deny" if ns.deny else "allow"})
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
    rc, _ = _operator(ns, "hold", {"reason": ns.reason})
    if rc == 0 and not ns.json:
        print("on hold: every request now waits for an operator")
    return rc


def cmd_release(ns: argparse.Namespace) -> int:
    rc, _ = _operator(ns, "release", {})
    if rc == 0 and not ns.json:
        print("released")
    return rc


def _event_line(e: dict[str, Any]) -> str:
    payload = e.get("payload") or {}
    note = payload.get("action") or payload.get("decision") or payload.get("status") or ""
    if e.get("kind") == "exec.finished":
        note = f"exit {payload.get('exit_codes')}"
    return "  ".join(
        [
            f"{e.get('seq'):>6}",
            str(e.get("time")),
            f"{sanitise(e.get('kind')):<17}",
            f"{sanitise(e.get('request_id') or '-', strict=True):<36}",
            f"{sanitise(e.get('writer')):<8}",
            sanitise(note),
        ]
    ).rstrip()


def cmd_events(ns: argparse.Namespace) -> int:
    args: dict[str, Any] = {}
    if ns.after is not None:
        args["after"] = ns.after
    if ns.tail is not None:
        args["tail"] = ns.tail
    if ns.limit is not None:
        args["limit"] = ns.limit
    if ns.follow and not args:
        args["tail"] = 10
    first = True
    while True:
        try:
            raw, reply = client.call(client.operator_socket(ns.socket), "events", args, timeout=30)
        except client.ClientError as exc:
            _unreachable(ns, exc)
            return 1
        data = reply.get("data") or {}
        if ns.json and (first or data.get("events") or not reply.get("ok")):
            sys.stdout.buffer.write(raw + b"\n")
            sys.stdout.flush()
        if not reply.get("ok"):
            error = reply.get("error") or {}
            if not ns.json:
                _err(f"{error.get('code')}: {error.get('message')}")
            return 1
        if not ns.json:
            for e in data.get("events", []):
                print(_event_line(e), flush=ns.follow)
        if not ns.follow:
            return 0
        first = False
        args = {"after": data.get("next_cursor", 0)} | ({"limit": ns.limit} if ns.limit else {})
        if len(data.get("events", [])) < (ns.limit or 64):
            time.sleep(ns.interval)


def cmd_audit_export(ns: argparse.Namespace) -> int:
    """Every event as JSON lines, paged through the events feed (oldest first)."""
    since = _parse_since(ns.since) if ns.since else None
    if ns.since and since is None:
        _err(f"audit export: --since takes an ISO 8601 time (got {ns.since!r})")
        return 2
    try:
        for events in client.event_pages(client.operator_socket(ns.socket), timeout=None):
            for event in events:
                when = _parse_since(str(event.get("time", "")))
                if since is None or when is None or when >= since:
                    sys.stdout.write(json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n")
    except client.ClientError as exc:
        _err(str(exc))
        return 1
    sys.stdout.flush()
    return 0


def _parse_since(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def cmd_audit(ns: argparse.Namespace) -> int:
    if ns.audit_command == "export":
        return cmd_audit_export(ns)
    if ns.audit_command == "head":
        rc, data = _operator(ns, "audit.head", {})
        if rc == 0 and not ns.json:
            print(f"{data.get('seq')} {data.get('hash')}")
        return rc
    from airlock.cli import audit

    if ns.audit_command == "verify" and getattr(ns, "journal", None):
        return fleet.verify_journal(ns)
    if ns.audit_command == "acknowledge":
        return audit.acknowledge(ns)
    return audit.verify(ns)


def cmd_policy_check(ns: argparse.Namespace) -> int:
    if not ns.command:
        _err("policy check: give a command after --")
        return 2
    args: dict[str, Any] = {"argv": ns.command, "privileged": ns.privileged}
    if ns.user:
        args["user"] = ns.user
    if ns.session:
        args["session"] = ns.session
    rc, data = _operator(ns, "policy.check", args)
    if rc == 0 and not ns.json:
        for stage in data.get("stages", []):
            print(f"{' '.join(stage.get('argv', []))}: {stage.get('decision')} (rule {stage.get('rule')}; binary {stage.get('resolved')})")
            if stage.get("decision") != "deny":
                print(f"  sandbox: {sandbox.describe(stage.get('sandbox'))}")
        print(f"decision: {data.get('decision')} (rule {data.get('rule')})")
    return rc


def cmd_show(ns: argparse.Namespace) -> int:
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
        ("from", f"{sanitise(peer.get('user', '?'))} (uid {peer.get('uid', data.get('peer_uid'))}), pid {peer.get('pid', '?')}"),
        ("session", sanitise(data.get("session") or "-")),
        ("host", sanitise(request.get("host") or "-")),
        ("reason", sanitise(data.get("reason") or "-")),
        ("runs as", "root (privileged)" if request.get("privileged") else "the requesting user"),
    ]
    for i, stage in enumerate(request.get("stages") or [], start=1):
        pairs.append((f"stage {i}", command_line(stage)))
    if decision:
        who = decision.get("by")
        if decision.get("grant_id"):
            who = f"grant {decision['grant_id']} (given by {decision.get('granted_by')})"
        text = f"{decision.get('decision')} by {who} (rule {decision.get('rule')})"
        if decision.get("reason"):
            text += f": {decision.get('reason')}"
        pairs.append(("decision", sanitise(text)))
    if decision.get("approvers"):
        pairs.append(("approvers", sanitise(", ".join(
            f"{a.get('principal')} ({a.get('fingerprint')})" if a.get("principal") else f"{a.get('user')} (uid {a.get('uid')})"
            for a in decision["approvers"]) + f" [{decision.get('quorum')}]")))
    waiting = render.quorum_line(data.get("detail") or {}) if data.get("pending") else ""
    if waiting:
        pairs.append(("waiting", waiting))
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
        pairs.append(("outcome", sanitise(text)))
    broken = data.get("lifecycle_error") or {}
    if broken:
        pairs.append(("lifecycle", style.bold(sanitise(
            f"FORBIDDEN at seq {broken.get('seq')}: {broken.get('kind')} in state {broken.get('state')}: {broken.get('reason')}"
        ))))
    print(fields(pairs))
    print()
    print("\n".join(_event_line(e) for e in data.get("events") or []) or "(no journal events yet)")
    return 0


def cmd_cancel(ns: argparse.Namespace) -> int:
    args: dict[str, Any] = {"operation_id": ns.operation_id}
    if ns.reason:
        args["reason"] = ns.reason
    rc, data = _operator(ns, "cancel", args)
    if rc == 0 and not ns.json:
        print(f"{sanitise(ns.operation_id, strict=True)}: cancelling ({data.get('was')})")
    return rc


def cmd_token(ns: argparse.Namespace) -> int:
    if ns.token_command == "issue":
        try:
            ttl = render.parse_ttl(ns.ttl)
        except ValueError as exc:
            _err(f"token issue: --ttl: {exc}")
            return 2
        args: dict[str, Any] = {"session": ns.session, "ttl_seconds": ttl}
        if ns.reason:
            args["reason"] = ns.reason
        rc, data = _operator(ns, "token.issue", args)
        if rc == 0 and not ns.json:
            # The token alone on stdout, so `TOKEN=$(airlock token issue ...)` works.
            print(data.get("token"))
            _err(f"token {data.get('token_id')} for session {sanitise(data.get('session'))}, expires {data.get('expires_at')}")
        return rc
    if (ns.token is None) == (ns.session is None):
        _err("token revoke: give a TOKEN or --session S (not both)")
        return 2
    args = {"token": ns.token} if ns.token is not None else {"session": ns.session}
    if ns.reason:
        args["reason"] = ns.reason
    rc, data = _operator(ns, "token.revoke", args)
    if rc == 0 and not ns.json:
        print(f"revoked {data.get('revoked')} token(s)")
    return rc


def cmd_wait(ns: argparse.Namespace) -> int:
    """Block until the operation settles; 0 only when it ran and its last stage exited 0."""
    started = time.monotonic()
    path = client.operator_socket(ns.socket)
    while True:
        try:
            raw, reply = client.call(path, "show", {"ref": ns.operation_id}, timeout=30)
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
                outcome = data.get("outcome") or {}
                detail = outcome.get("exit_codes") if outcome.get("exit_codes") is not None else outcome.get("code")
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


def cmd_config_show(ns: argparse.Namespace) -> int:
    from airlock.common import config as configuration

    try:
        cfg = configuration.load(Path(ns.config) if ns.config else None)
    except configuration.ConfigError as exc:
        _err(str(exc))
        return 1
    if ns.json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        import yaml

        print(f"# effective configuration from {cfg.source}")
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def cmd_dev_up(ns: argparse.Namespace) -> int:
    from airlock.cli import dev

    return dev.up(Path(ns.runtime_dir), Path(ns.config) if ns.config else None)


# --- the parser -------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="airlock",
        description="airlock: a privileged-command gateway for AI agents. Agents ask with `airlock run`; "
        "operators approve, audit and steer with the other commands.",
    )
    p.add_argument("--version", action="version", version=f"airlock {__version__}")
    # reference/004: "`--json` on any command" -- so also before the command
    # (`airlock --json status`); a dest of its own, since a subcommand's
    # default would overwrite a shared one.
    p.add_argument("--json", dest="global_json", action="store_true", help="print the daemon's response envelopes verbatim")
    fleet.add_global_arguments(p)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def op(name: str, help_text: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.add_argument("--socket", help="operator socket (default: $AIRLOCK_OPERATOR_SOCKET, else /run/airlock/operator.sock)")
        sp.add_argument("--json", action="store_true", help="print the daemon's response envelope verbatim")
        return sp

    run = sub.add_parser(
        "run",
        help="run a command through airlock",
        description="Send a command to airlock and run it once policy or an operator approves. "
        "Exit status: the command's own (128+N if killed by signal N); 126 denied; 124 approval timed out; "
        "125 any airlock error.",
    )
    run.add_argument("--socket", help="agent socket (default: $AIRLOCK_SOCKET, else /run/airlock/agent.sock)")
    run.add_argument("--no-privilege", action="store_true", help="run as yourself instead of root")
    run.add_argument("--reason", help="why, for the operator and the audit record")
    run.add_argument("--session", help="your session name (policy may match it)")
    run.add_argument("--cwd", help="working directory (absolute)")
    run.add_argument("--env", action="append", metavar="NAME=VALUE", help="set an allowed environment variable")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="kill the command after this long")
    run.add_argument("--operation-id", help="a stable ID: a retry with the same ID replays instead of running twice "
                     "(default: a fresh ID for each call, so the same command typed twice runs twice)")
    run.add_argument("--token", help="a session token from an operator (default: $AIRLOCK_TOKEN)")
    run.add_argument("--json", action="store_true", help="print the response envelope verbatim")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    run.set_defaults(func=cmd_run)

    op("status", "show whether airlock is on hold and how much is pending").set_defaults(func=cmd_status)
    op("pending", "list requests waiting for an operator").set_defaults(func=cmd_pending)
    for verb, text in (("approve", "approve a pending request"), ("deny", "deny a pending request")):
        sp = op(verb, text)
        sp.add_argument("id", help="request ID (or a unique prefix)")
        sp.add_argument("--reason", help="recorded in the audit journal")
        signed = sp.add_mutually_exclusive_group()
        signed.add_argument("--sign", metavar="KEYFILE",
                            help="sign the request's statement with this OpenSSH key (ssh-keygen -Y sign) and submit it")
        signed.add_argument("--signature", metavar="FILE",
                            help="submit a signature made elsewhere over `airlock statement ID` ('-': stdin)")
        sp.add_argument("--principal", help="the signer's principal in allowed_signers (default: found from the key)")
        if verb == "approve":
            sp.add_argument("--grant", metavar="DURATION",
                            help="also let the same requester run this again without asking for this long (90s, 30m, 8h)")
            sp.add_argument("--scope", choices=("command", "rule"), default="command",
                            help="what the grant covers: the exact same command (default) or anything the rule allows")
        sp.set_defaults(func=cmd_decide, verb=verb)
    sp = op("grants", "list live time-boxed grants, or revoke one (grants revoke GRANT_ID)")
    sp.add_argument("action", nargs="?", choices=("list", "revoke"), default="list")
    sp.add_argument("grant_id", nargs="?")
    sp.add_argument("--reason", help="recorded in the audit journal")
    sp.set_defaults(func=cmd_grants)
    sp = op("statement", "print the exact statement a signer signs to approve (or deny) a pending request")
    sp.add_argument("id", help="request ID (or a unique prefix)")
    sp.add_argument("--deny", action="store_true", help="the statement that denies it")
    sp.set_defaults(func=cmd_statement)
    sp = op("hold", "make every request wait for an operator (emergency brake)")
    sp.add_argument("--reason", required=True)
    sp.set_defaults(func=cmd_hold)
    op("release", "lift a hold").set_defaults(func=cmd_release)
    sp = op("events", "show the audit events feed")
    sp.add_argument("--after", type=int, help="events after this sequence number")
    sp.add_argument("--tail", type=int, help="the newest N events (wins over --after)")
    sp.add_argument("--limit", type=int, help="at most this many per page (1-256, default 64)")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing new events as they come")
    sp.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_events)
    sp = op("show", "a request's whole story: who, what, why, decision, outcome, events")
    sp.add_argument("ref", help="request ID, operation ID, or a unique prefix of either")
    sp.set_defaults(func=cmd_show)
    sp = op("cancel", "cancel an operation (deny it if pending, stop it if running)")
    sp.add_argument("operation_id")
    sp.add_argument("--reason", help="recorded in the audit journal")
    sp.set_defaults(func=cmd_cancel)
    sp = op("wait", "block until an operation settles; exit 0 only if it ran and exited 0")
    sp.add_argument("operation_id", help="operation ID (or request ID)")
    sp.add_argument("--timeout", type=float, metavar="SECONDS", help="give up after this long (exit 1)")
    sp.add_argument("--interval", type=float, default=0.5, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_wait)
    sp = op("watch", "live approval console: y approves, any other key denies")
    fleet.add_watch_arguments(sp)
    sp.set_defaults(func=cmd_watch)

    token = sub.add_parser("token", help="issue and revoke agents' session tokens")
    token_sub = token.add_subparsers(dest="token_command", metavar="SUBCOMMAND", required=True)
    for name, text in (("issue", "issue a token for a session (printed alone on stdout)"),
                       ("revoke", "revoke one token, or every token of a session")):
        sp = token_sub.add_parser(name, help=text, description=text)
        sp.add_argument("--socket", help="operator socket")
        sp.add_argument("--json", action="store_true", help="print the daemon's response envelope verbatim")
        sp.add_argument("--reason", help="recorded in the audit journal")
        if name == "issue":
            sp.add_argument("--session", required=True, help="the session name the token stands for")
            sp.add_argument("--ttl", default="1h", help="lifetime: 90s, 30m, 1h, 2d (default 1h)")
        else:
            sp.add_argument("token", nargs="?", help="the token to revoke")
            sp.add_argument("--session", help="revoke every token of this session")
        sp.set_defaults(func=cmd_token)

    audit = sub.add_parser("audit", help="verify and inspect the audit journal")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="SUBCOMMAND", required=True)
    anchors_help = ("journald, an anchors file, or none (default: journald if readable, and the anchors "
                    "file beside the database)")
    for name, text in (
        ("verify", "check the whole hash chain, and the database against its anchors; name the first bad record"),
        ("head", "print the newest sequence number and hash (keep them off the host)"),
        ("export", "print every audit event as JSON lines"),
        ("acknowledge", "accept a mismatch with the anchors and start a new chain segment (journal stopped; root)"),
    ):
        sp = audit_sub.add_parser(name, help=text, description=text)
        if name != "acknowledge":
            sp.add_argument("--socket", help="operator socket")
        if name != "export":
            sp.add_argument("--json", action="store_true")
        if name == "verify":
            sp.add_argument("--from", dest="from_seq", type=int, help="start at this sequence number")
            sp.add_argument("--anchor", help="the hash `airlock audit head` printed for the record at --from")
            sp.add_argument("--lifecycle", action="store_true",
                            help="also fold every request's events through the lifecycle table and name each "
                                 "request whose story it forbids")
            fleet.add_verify_arguments(sp)
        if name in ("verify", "acknowledge"):
            sp.add_argument("--anchors", metavar="journald|FILE|none", help=anchors_help)
            sp.add_argument("--config", help="airlock.yaml to read (default /etc/airlock/airlock.yaml)")
        if name == "acknowledge":
            sp.add_argument("--reason", required=True, help="why, recorded in the new segment's first record")
            sp.add_argument("--database", help="the journal database (default: the configured state_dir's)")
        if name == "export":
            sp.add_argument("--since", help="only events at or after this ISO 8601 time")
            sp.add_argument("--format", choices=["jsonl"], default="jsonl", help="output format (jsonl)")
        sp.set_defaults(func=cmd_audit)
    fleet.register_audit(audit_sub)

    policy = sub.add_parser("policy", help="inspect the policy")
    policy_sub = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    sp = policy_sub.add_parser("check", help="show the decision for a command without running it")
    sp.add_argument("--socket", help="operator socket")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--user", help="as this user (default: you)")
    sp.add_argument("--session")
    group = sp.add_mutually_exclusive_group()
    group.add_argument("--privileged", dest="privileged", action="store_true", default=True)
    group.add_argument("--no-privilege", dest="privileged", action="store_false")
    sp.add_argument("command", nargs=argparse.REMAINDER)
    sp.set_defaults(func=cmd_policy_check)

    cfg = sub.add_parser("config", help="show the effective configuration")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    sp = cfg_sub.add_parser("show", help="print every setting with its effective value")
    sp.add_argument("--config", help="configuration file (default: /etc/airlock/airlock.yaml)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_config_show)

    dev = sub.add_parser("dev", help="run the whole stack in the foreground for development")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="SUBCOMMAND", required=True)
    sp = dev_sub.add_parser("up", help="start all four services with sockets under a runtime folder")
    sp.add_argument("--runtime-dir", default="./run", help="sockets, state and logs go here (default ./run)")
    sp.add_argument("--config", help="a config file whose keys override the built-in dev config")
    sp.set_defaults(func=cmd_dev_up)
    mcp_cli.register(sub)
    gateway_cli.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    ns = p.parse_args(argv)
    if not getattr(ns, "func", None):
        p.print_help(sys.stderr)
        return 2
    if ns.global_json:
        if not hasattr(ns, "json"):
            p.error(f"--json is not available for {ns.cmd}")
        ns.json = True
    command = getattr(ns, "command", None)
    if isinstance(command, list) and command and command[0] == "--":
        ns.command = command[1:]
    if getattr(ns, "remote_hosts", None):
        from airlock.cli import remote

        return remote.run_remote(ns, sys.argv[1:] if argv is None else argv)
    try:
        return int(ns.func(ns))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
