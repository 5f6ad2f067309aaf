"""`airlock watch`: a live approval console on a plain terminal.

It polls ``pending`` on the operator socket and puts each waiting request in
front of the reviewer with everything needed to judge it.  One key decides:
``y`` approves, any other key denies.  Keys typed before the prompt appeared
are thrown away (``tcflush(TCIFLUSH)`` just before the prompt), so type-ahead
meant for another window cannot approve anything.  Ctrl-C leaves without
deciding (the terminal stays in cbreak mode, so the kernel still turns it
into SIGINT).  Several consoles may watch at once: the first decision wins
and the others report "decided elsewhere".
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable
from typing import Any

from airlock.common import client, sandbox
from airlock.common.render import Style, command_line, diff_lines, duration, fields, file_review, sanitise, use_colour

POLL_SECONDS = 1.0
CLEAR = "\x1b[H\x1b[2J"

Call = Callable[[str, dict[str, Any]], dict[str, Any]]


def describe(p: dict[str, Any], style: Style, index: int, total: int) -> str:
    """One pending request as a reviewer needs it; every agent-chosen value is sanitised."""
    peer = p.get("peer") or {}
    privileged = bool(p.get("privileged"))
    lines = [
        style.bold(f"request {sanitise(p.get('request_id'), strict=True)}") + style.dim(f"   ({index} of {total} pending)"),
        "",
    ]
    pairs: list[tuple[str, object]] = [
        ("from", f"{sanitise(peer.get('user'))} (uid {peer.get('uid')}), pid {peer.get('pid')}"),
        ("host", sanitise(p.get("host")) or "-"),
        ("session", sanitise(p.get("session")) or "-"),
        ("reason", sanitise(p.get("reason")) or style.dim("(none given)")),
        ("runs as", style.red("root (privileged)") if privileged else f"{sanitise(peer.get('user'))} (unprivileged)"),
    ]
    for i, stage in enumerate(p.get("stages") or [], start=1):
        pairs.append((f"stage {i}", command_line(stage.get("argv") or [])))
        binary, resolved = stage.get("binary"), stage.get("resolved")
        if binary is None and resolved is None:
            shown = style.red("(not found: cannot run)")
        elif stage.get("symlink"):
            shown = f"{sanitise(binary, strict=True)} -> {sanitise(resolved, strict=True)} (symlink)"
        else:
            shown = sanitise(resolved or binary, strict=True)
        pairs.append(("  binary", shown))
        confined = (p.get("sandbox") or [])[i - 1] if len(p.get("sandbox") or []) >= i else None
        pairs.append(("  sandbox", sanitise(sandbox.describe(confined))))
    request = p.get("request") or {}
    pairs.extend(file_review(request))
    env = p.get("env_names") or []
    pairs.append(("env", ", ".join(sanitise(n, strict=True) for n in env) or "-"))
    pairs.append(("rule", f"{sanitise(p.get('rule'))} (ask)"))
    pairs.append(("operation", sanitise(p.get("operation_id"), strict=True)))
    diff = diff_lines(request["diff"]) if request.get("diff") else ""
    return "\n".join(lines) + "\n" + fields(pairs) + ("\n\n" + diff if diff else "")


def _left(p: dict[str, Any]) -> float:
    expires = p.get("expires")
    return float(expires) - time.time() if isinstance(expires, (int, float)) else float(p.get("seconds_left") or 0)


class Console:
    def __init__(self, call: Call, fd: int, out: Any) -> None:
        self.call = call
        self.fd = fd
        self.out = out
        self.style = Style(use_colour(out))

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def pending(self) -> list[dict[str, Any]]:
        reply = self.call("pending", {})
        if not reply.get("ok"):
            raise client.ClientError(f"{(reply.get('error') or {}).get('code')}: {(reply.get('error') or {}).get('message')}")
        items: list[dict[str, Any]] = (reply.get("data") or {}).get("pending") or []
        return items

    def run(self) -> int:
        idle_shown = False
        while True:
            waiting = self.pending()
            if not waiting:
                if not idle_shown:
                    self.write(CLEAR + "airlock watch: no pending requests; waiting (Ctrl-C quits)\n")
                    idle_shown = True
                time.sleep(POLL_SECONDS)
                continue
            idle_shown = False
            self.review(waiting[0], len(waiting))

    def review(self, p: dict[str, Any], total: int) -> None:
        request_id = str(p.get("request_id"))
        self.write(CLEAR + describe(p, self.style, 1, total) + "\n\n")
        # Whatever was typed before the prompt was seen is not an answer.
        termios.tcflush(self.fd, termios.TCIFLUSH)
        key = self.ask(p)
        if key is None:
            self.write("\n" + self.style.yellow("decided elsewhere (or timed out)") + "\n")
            time.sleep(1.0)
            return
        verb = "approve" if key in (b"y", b"Y") else "deny"
        reply = self.call(verb, {"id": request_id, "reason": "airlock watch"})
        if reply.get("ok"):
            word = self.style.green("approved") if verb == "approve" else self.style.red("denied")
            self.write(f"\n{word} {sanitise(request_id, strict=True)}\n")
        else:
            error = reply.get("error") or {}
            if error.get("code") in ("conflict", "not_found"):
                self.write("\n" + self.style.yellow("decided elsewhere") + "\n")
            else:
                self.write(f"\n{self.style.red(sanitise(error.get('code')))}: {sanitise(error.get('message'))}\n")
        time.sleep(1.0)

    def ask(self, p: dict[str, Any]) -> bytes | None:
        """The first key pressed, or None when the request stopped waiting."""
        request_id = p.get("request_id")
        last_poll = time.monotonic()
        while True:
            self.write(
                "\r\x1b[K"
                + self.style.bold("approve? ")
                + f"[y] approve, any other key denies   ({duration(_left(p))} left) "
            )
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if ready:
                data = os.read(self.fd, 64)
                if data:
                    return data[:1]
            if time.monotonic() - last_poll >= POLL_SECONDS:
                last_poll = time.monotonic()
                if not any(q.get("request_id") == request_id for q in self.pending()):
                    return None


def watch(socket_path: str) -> int:
    if not sys.stdin.isatty():
        print("airlock: watch needs a terminal on stdin", file=sys.stderr)
        return 1

    def call(verb: str, args: dict[str, Any]) -> dict[str, Any]:
        _raw, reply = client.call(socket_path, verb, args, timeout=30)
        return reply

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        # cbreak, not raw: keys arrive one at a time unechoed, and Ctrl-C still interrupts.
        tty.setcbreak(fd)
        return Console(call, fd, sys.stdout).run()
    except client.ClientError as exc:
        print(f"\nairlock: {exc}", file=sys.stderr)
        return 1
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
