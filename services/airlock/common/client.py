"""A small blocking client of the two front doors (agent and operator), shared by
the `airlock` command, the gateway, the MCP server and the notify relay; and
where those clients look for the doors by default."""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from airlock.common.framing import NEED_DATA, FrameDecoder
from airlock.common.wire import operator as op
from airlock.common.wire.message import Message
from airlock.common.wire.verb import DoorName, Verb

MAX_REPLY = 128 * 1024 * 1024

A = TypeVar("A", bound=Message)


class ClientError(Exception):
    """The daemon could not be reached or answered nonsense (exit 125 / 1)."""


def connect(path: str, timeout: float | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except FileNotFoundError:
        raise ClientError(
            f"no airlock socket at {path} (is airlock running? see `systemctl status airlock.socket`)"
        ) from None
    except PermissionError:
        raise ClientError(
            f"permission denied on {path} (agents need group 'airlock', operators 'airlock-admin')"
        ) from None
    except OSError as exc:
        raise ClientError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    return sock


def lines(sock: socket.socket) -> Iterator[tuple[bytes, dict[str, Any]]]:
    decoder = FrameDecoder(MAX_REPLY)
    while True:
        frame = decoder.next_frame()
        if frame is NEED_DATA:
            try:
                chunk = sock.recv(1024 * 1024)
            except ConnectionResetError:
                return
            if not chunk:
                return
            decoder.feed(chunk)
            continue
        assert isinstance(frame, bytes)
        try:
            obj = json.loads(frame)
        except ValueError:
            raise ClientError("the daemon sent a malformed reply") from None
        if not isinstance(obj, dict):
            raise ClientError("the daemon sent a malformed reply")
        yield frame, obj


def call(
    path: str,
    verb: Verb[A, Any],
    args: A,
    *,
    token: str | None = None,
    on_event: Callable[[bytes, dict[str, Any]], None] | None = None,
    timeout: float | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """Send one native request of a declared verb; return the final response (raw line and object).

    The reply is returned as the door sent it (the CLI prints ``--json`` as it came)."""
    if verb.door not in (DoorName.OPERATOR, DoorName.AGENT):
        raise ValueError(f"{verb.door}.{verb.name}: the command-line client calls only the front doors")
    request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb.name, "args": args.to_dict(), "token": token}
    with connect(path, timeout) as sock:
        try:
            sock.sendall(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it read the request (busy, unauthorized): the refusal is there to read
        for raw, obj in lines(sock):
            if "event" in obj:
                if on_event is not None:
                    on_event(raw, obj)
                continue
            return raw, obj
    raise ClientError("the daemon closed the connection without answering")


def event_pages(path: str, *, timeout: float | None = 30, limit: int = 256) -> Iterator[list[dict[str, Any]]]:
    """The whole events feed from the start, one page at a time (the cursor-paged ``events`` verb).

    Raises `ClientError` when the socket cannot be reached or the daemon
    answers with an error (its code and message).
    """
    cursor = 0
    while True:
        _raw, reply = call(path, op.EVENTS, op.Events(after=cursor, limit=limit), timeout=timeout)
        if not reply.get("ok"):
            error = reply.get("error") or {}
            raise ClientError(f"{error.get('code')}: {error.get('message')}")
        page = reply.get("data") or {}
        events = page.get("events") or []
        yield events
        nxt = int(page.get("next_cursor") or cursor)
        if not events or nxt <= cursor or nxt >= int(page.get("latest") or nxt):
            return
        cursor = nxt


# Where the clients look for the doors: --socket, else the environment, else these.
AGENT_SOCKET = "/run/airlock/agent.sock"
OPERATOR_SOCKET = "/run/airlock/operator.sock"


def agent_socket(given: str | None) -> str:
    return given or os.environ.get("AIRLOCK_SOCKET") or AGENT_SOCKET


def operator_socket(given: str | None) -> str:
    return given or os.environ.get("AIRLOCK_OPERATOR_SOCKET") or OPERATOR_SOCKET
