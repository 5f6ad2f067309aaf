"""What the `airlock` commands share: error output, the unreachable-daemon envelope, one operator-door call."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TypeVar

from airlock.cli import exitcodes
from airlock.common import client, render
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb

A = TypeVar("A", bound=Message)


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
    # A daemon's message may quote what an agent sent: neutralised like every other terminal line.
    print(f"airlock: {render.sanitise(message)}", file=sys.stderr)


def _operator_call(ns: argparse.Namespace, verb: Verb[A, Any], args: A) -> tuple[bytes, dict[str, Any]] | None:
    """Call a declared operator verb (`wire.operator`): the raw line and the reply when it was answered ok.

    A refusal or an unreachable door is reported here (the raw reply with ``--json``) and gives None."""
    path = client.operator_socket(ns.socket)
    try:
        raw, reply = client.call(path, verb, args)
    except client.ClientError as exc:
        _unreachable(ns, exc)
        return None
    if reply.get("ok"):
        return raw, reply
    if ns.json:
        sys.stdout.buffer.write(raw + b"\n")
        sys.stdout.flush()
        return None
    error = reply.get("error") or {}
    # The operator door keeps to reference/004's codes; the precise one is in details.reason.
    precise = (error.get("details") or {}).get("reason")
    code = f"{error.get('code')} ({precise})" if isinstance(precise, str) else error.get("code")
    _err(f"{code}: {error.get('message')}")
    hint = exitcodes.wrong_door(error.get("code"), path, operator_command=True)
    if hint is not None:
        _err(hint)
    return None


def _operator(ns: argparse.Namespace, verb: Verb[A, Any], args: A) -> tuple[int, dict[str, Any]]:
    """Call a declared operator verb (`wire.operator`); the reply's data as the door sent it."""
    answered = _operator_call(ns, verb, args)
    if answered is None:
        return 1, {}
    raw, reply = answered
    if ns.json:
        sys.stdout.buffer.write(raw + b"\n")
        sys.stdout.flush()
    return 0, reply.get("data") or {}


def _table(rows: list[list[str]], header: list[str]) -> str:
    return render.table(rows, header)
