"""`airlock run`: the agent's command (the full path; cli/quick.py is the short one, with the same output and exit
codes)."""

from __future__ import annotations

import argparse
import base64
import os
import sys
import uuid
from typing import Any

from airlock.cli import exitcodes
from airlock.cli.base import _err, _unreachable
from airlock.cli.waiting import waiting_message
from airlock.common import client, render
from airlock.common.codec import iso_utc
from airlock.common.tokenfile import TokenFileError, read_token_file

EXIT_DENIED = 126
EXIT_APPROVAL_TIMEOUT = 124
EXIT_AIRLOCK_ERROR = 125


def cmd_run(ns: argparse.Namespace) -> int:
    args = run_args(ns)
    if args is None:
        return 2
    noticed = False

    def on_event(_raw: bytes, event: dict[str, Any]) -> None:
        nonlocal noticed
        if event.get("event") == "pending_approval" and not noticed and not ns.json:
            noticed = True
            _err(waiting_message(event))

    try:
        token = _token(ns)
        raw, reply = client.call(client.agent_socket(ns.socket), "exec", args, on_event=on_event, token=token)
    except TokenFileError as exc:
        _err(str(exc))
        return EXIT_AIRLOCK_ERROR
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
            hint = exitcodes.wrong_door(
                code, client.agent_socket(ns.socket), operator_command=False
            ) or exitcodes.refused_token(code, token is not None)
            if hint is not None:
                _err(hint)
        return exitcodes.for_error(code)
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


def _token(ns: argparse.Namespace) -> str | None:
    """The session token: --token-file, else $AIRLOCK_TOKEN, else None (`TokenFileError` for a bad file)."""
    if not ns.token_file:
        return os.environ.get("AIRLOCK_TOKEN") or None
    return read_token_file(ns.token_file)


def run_args(ns: argparse.Namespace) -> dict[str, Any] | None:
    """The exec request's arguments from the command line; None after reporting a usage error."""
    if ns.token is not None:
        _err(
            "run: --token is not accepted: a command line is readable by every local user; "
            "put the token in $AIRLOCK_TOKEN or in a file of your own (chmod 600) given with --token-file"
        )
        return None
    if not ns.command:
        _err("run: give a command after --, e.g. airlock run -- systemctl status nginx")
        return None
    args: dict[str, Any] = {
        "argv": ns.command,
        "privileged": not ns.no_privilege,
        "time": iso_utc(),
    }
    for key in ("reason", "session", "cwd", "user"):
        if getattr(ns, key, None):
            args[key] = getattr(ns, key)
    if ns.timeout:
        args["timeout_ms"] = int(ns.timeout * 1000)
    if ns.env:
        env = {}
        for item in ns.env:
            name, sep, value = item.partition("=")
            if not sep:
                _err(f"run: --env takes NAME=VALUE (got {item!r})")
                return None
            env[name] = value
        args["env"] = env
    # Each `airlock run` is a new intent with an ID of its own (typing the same
    # command twice runs it twice); the CLI names it so its own retry after a
    # lost connection replays instead of running again.
    args["operation_id"] = ns.operation_id or f"cli-{uuid.uuid4()}"
    args["stream"] = True
    return args


def exit_status(evidence: dict[str, Any]) -> int:
    """The last stage's exit code, or 128+N for signal N (as a shell reports it)."""
    stages = evidence.get("stages") or [{}]
    last = stages[-1]
    if isinstance(last.get("signal"), int) and last.get("exit_code") is None:
        return 128 + int(last["signal"])
    code = last.get("exit_code")
    return int(code) if isinstance(code, int) else EXIT_AIRLOCK_ERROR


def cmd_can(ns: argparse.Namespace) -> int:
    """`airlock can -- CMD`: the policy's answer for this request of yours, explained; nothing runs."""
    args = run_args(ns)
    if args is None:
        return 2
    for key in ("operation_id", "stream"):
        args.pop(key, None)
    try:
        token = _token(ns)
        raw, reply = client.call(client.agent_socket(ns.socket), "can", args, token=token)
    except TokenFileError as exc:
        _err(str(exc))
        return exitcodes.EXIT_AIRLOCK_ERROR
    except client.ClientError as exc:
        _unreachable(ns, exc)
        return exitcodes.EXIT_AIRLOCK_ERROR
    if ns.json:
        sys.stdout.buffer.write(raw + b"\n")
        sys.stdout.flush()
    if not reply.get("ok"):
        error = reply.get("error") or {}
        if not ns.json:
            _err(f"{error.get('code')}: {render.sanitise(error.get('message'))}")
        return exitcodes.for_error(error.get("code"))
    data = reply.get("data") or {}
    if not ns.json:
        print(explained(data))
    return exitcodes.for_answer(data.get("decision"), any(s.get("not_found") for s in data.get("stages", [])))


def explained(data: dict[str, Any]) -> str:
    """`airlock can`'s answer as lines a person (or a model) reads."""
    lines = []
    for stage in data.get("stages", []):
        command = render.sanitise(" ".join(stage.get("argv") or []))
        if stage.get("not_found"):
            lines.append(f"{command}: command not found (searched {data.get('searched')})")
            continue
        rules = stage.get("rules") or []
        why = (
            "no rule matches it: the policy's default"
            if stage.get("default")
            else "; ".join(
                f"rule {render.sanitise(r.get('name'))}"
                + (f" ({render.sanitise(r.get('description'))})" if r.get("description") else "")
                for r in rules
            )
        )
        verb = {"allow": "runs at once", "ask": "asks an operator", "deny": "is refused"}.get(stage.get("decision"))
        lines.append(f"{command} -> {render.sanitise(stage.get('binary'))}: {verb} ({why})")
    decision = data.get("decision")
    as_whom = render.sanitise(data.get("run_as"))
    if decision == "allow":
        lines.append(f"airlock would run it at once, as {as_whom}.")
    elif decision == "ask":
        needed = data.get("approvals_needed") or 1
        held = " (airlock is on hold: every request waits for an operator)" if data.get("held") else ""
        lines.append(
            f"airlock would ask an operator ({needed} approval{'s' if needed != 1 else ''}) before running it "
            f"as {as_whom}{held}."
        )
    else:
        lines.append("airlock would refuse it; nothing would run. Do not try variants to get around it.")
    if data.get("policy_note"):  # issue 44: the files on disk were refused; say what decides instead
        lines.append(f"note: {render.sanitise(data['policy_note'])}")
    return "\n".join(lines)
