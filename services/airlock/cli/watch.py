"""`airlock watch`: a live approval console on a plain terminal.

It polls ``pending`` on the operator socket and puts each waiting request in
front of the reviewer with everything needed to judge it.  Only explicit keys
decide (issue 32): ``y`` approves, ``G`` (shift-g) approves and grants the same
command to the same requester for `GRANT_SECONDS` (issue 18), ``n`` denies
and asks for the reason the agent will read (Enter for none); any other key
(Enter included) decides nothing.  Keys typed before the prompt appeared
are thrown away (``tcflush(TCIFLUSH)`` just before the prompt), so type-ahead
meant for another window cannot approve anything.  Ctrl-C leaves without
deciding (the terminal stays in cbreak mode, so the kernel still turns it
into SIGINT).  Several consoles may watch at once: the first decision wins
and the others report "decided elsewhere".

While nothing is pending it lists the jobs running now (issue 35): ``k``
then the job's number sends it SIGTERM (`airlock kill`, journaled with the
reason ``airlock watch``); any other key after ``k`` kills nothing.
"""

from __future__ import annotations

import os
import select
import shlex
import sys
import termios
import time
import tty
from collections.abc import Callable
from typing import Any

from airlock.common import arguments, client, sandbox
from airlock.common.render import (
    Style,
    command_line,
    cwd_and_stdin,
    diff_lines,
    duration,
    fields,
    file_review,
    person,
    reviewer_line,
    sanitise,
    use_colour,
)

POLL_SECONDS = 1.0
GRANT_SECONDS = 30 * 60  # G: approve and grant the same command for 30 minutes
REASON_CHARS = 200  # a deny reason typed at the console
CLEAR = "\x1b[H\x1b[2J"
MAX_RUNNING_SHOWN = 9  # one key picks one

Call = Callable[[str, dict[str, Any]], dict[str, Any]]


def _runs_as(p: dict[str, Any], style: Style, privileged: bool, peer: dict[str, Any]) -> str:
    """Whom the job runs as: root, another account (issue 48: a rule's run_as), or the agent itself."""
    run_as = p.get("run_as") or {}
    if privileged and run_as.get("uid") not in (None, 0):
        return style.red(f"{sanitise(run_as.get('user'))} (uid {run_as.get('uid')}, privileged: another account)")
    return style.red("root (privileged)") if privileged else f"{sanitise(peer.get('user'))} (unprivileged)"


def describe(p: dict[str, Any], style: Style, index: int, total: int) -> str:
    """One pending request as a reviewer needs it; every agent-chosen value is sanitised."""
    peer = p.get("peer") or {}
    privileged = bool(p.get("privileged"))
    lines = [
        style.bold(f"request {sanitise(p.get('request_id'), strict=True)}")
        + style.dim(f"   ({index} of {total} pending)"),
        "",
    ]
    pairs: list[tuple[str, object]] = [
        ("from", f"{sanitise(peer.get('user'))} (uid {peer.get('uid')}), pid {peer.get('pid')}"),
        ("host", sanitise(p.get("host")) or "-"),
        ("session", sanitise(p.get("session")) or "-"),
        ("reason", sanitise(p.get("reason")) or style.dim("(none given)")),
        ("runs as", _runs_as(p, style, privileged, peer)),
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
        names = (p.get("credentials") or [])[i - 1] if len(p.get("credentials") or []) >= i else []
        if names:  # issue 35: credentials the job would receive, by name
            pairs.append(("  credentials", sanitise(", ".join(names))))
    for line in arguments.flagged(p.get("arguments")):  # issue 27: others can change what the job reads
        pairs.append((style.red(arguments.FLAG), sanitise(line)))
    if p.get("reviewer"):  # issue 34: an opinion, escaped like every request value
        pairs.append(("reviewer", sanitise(reviewer_line(p["reviewer"]).removeprefix("reviewer "))))
    request = p.get("request") or {}
    pairs.extend(cwd_and_stdin(p))  # issue 45: where it runs and what it reads, bound to the ticket
    pairs.extend(file_review(request))
    if p.get("cwd") is None:  # a command's environment is among cwd_and_stdin's pairs, with its values
        env = p.get("env_names") or []
        pairs.append(("env", ", ".join(sanitise(n, strict=True) for n in env) or "-"))
    pairs.append(("rule", f"{sanitise(p.get('rule'))} (ask)"))
    attached = [str(a) for a in p.get("attached") or []]
    if attached:  # issue 34: identical requests of the same agent, decided with this one
        pairs.append(
            ("attached", f"{len(attached)} identical: " + ", ".join(sanitise(a, strict=True) for a in attached))
        )
    quorum = p.get("quorum") or {}
    if quorum.get("needed", 1) > 1:
        who = ", ".join(sanitise(person(v)) for v in quorum.get("approvers") or [])
        pairs.append(("approvals", f"{sanitise(quorum.get('progress'))}" + (f" so far ({who})" if who else "")))
    pairs.append(("operation", sanitise(p.get("operation_id"), strict=True)))
    if p.get("expect"):  # issue 27: decides this request only, from any other terminal
        request_id, expect = sanitise(p.get("request_id"), strict=True), sanitise(p.get("expect"), strict=True)
        pairs.append(("approve line", f"airlock approve {shlex.quote(request_id)} --expect {shlex.quote(expect)}"))
    diff = diff_lines(request["diff"]) if request.get("diff") else ""
    return "\n".join(lines) + "\n" + fields(pairs) + ("\n\n" + diff if diff else "")


def _left(p: dict[str, Any]) -> float:
    expires = p.get("expires")
    return float(expires) - time.time() if isinstance(expires, (int, float)) else float(p.get("seconds_left") or 0)


def running_lines(jobs: list[dict[str, Any]]) -> str:
    """The running jobs, numbered for the kill key; every value sanitised."""
    return "".join(
        f"  [{i}] {sanitise(j.get('request_id') or j.get('operation_id'), strict=True)}: agent uid "
        f"{sanitise(j.get('agent_uid'))} as uid {sanitise(j.get('uid'))}, "
        + " | ".join(command_line([str(a) for a in stage]) for stage in j.get("stages") or [])
        + f" (since {sanitise(j.get('started_at'))})\n"
        for i, j in enumerate(jobs, start=1)
    )


def _whose(p: dict[str, Any]) -> tuple[Any, str]:
    """A pending request's key: (agent uid, request ID), as approval keys it."""
    return (p.get("peer") or {}).get("uid"), str(p.get("request_id"))


class Console:
    def __init__(self, call: Call, fd: int, out: Any) -> None:
        self.call = call
        self.fd = fd
        self.out = out
        self.style = Style(use_colour(out))
        # Requests this console approved towards a quorum: not shown again (its vote counts once).
        # Keyed by (agent uid, request ID): request IDs are each agent's own (issue 27).
        self.voted: set[tuple[Any, str]] = set()

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def banner(self, p: dict[str, Any]) -> str:
        """What goes above a request (the multi-host console names its host there)."""
        return ""

    def pending(self) -> list[dict[str, Any]]:
        reply = self.call("pending", {})
        if not reply.get("ok"):
            raise client.ClientError(
                f"{(reply.get('error') or {}).get('code')}: {(reply.get('error') or {}).get('message')}"
            )
        items: list[dict[str, Any]] = (reply.get("data") or {}).get("pending") or []
        # Issue 34: an attached request is decided with its first (shown there as "attached"): no question.
        return [p for p in items if not p.get("attached_to")]

    def grants(self) -> str:
        """The live time-boxed grants, one line each (issue 18); empty when there are none."""
        reply = self.call("grants", {})
        items = (reply.get("data") or {}).get("grants") or [] if reply.get("ok") else []
        return "".join(
            f"  grant {sanitise(g.get('grant_id'), strict=True)}: uid {g.get('uid')}, {sanitise(g.get('scope'))} "
            f"{sanitise(g.get('rule') if g.get('scope') == 'rule' else g.get('command'))}, "
            f"about {max(1, round(float(g.get('seconds_left') or 0) / 60))} min left"
            + (f", {g.get('uses_left')} of {g.get('uses')} uses left" if isinstance(g.get("uses"), int) else "")
            + f" (by {sanitise(g.get('made_by'))})\n"
            for g in items
        )

    def running(self) -> list[dict[str, Any]]:
        """The jobs running now (at most `MAX_RUNNING_SHOWN`); none when the door does not list them."""
        reply = self.call("running", {})
        items: list[dict[str, Any]] = (reply.get("data") or {}).get("running") or [] if reply.get("ok") else []
        return items[:MAX_RUNNING_SHOWN]

    def run(self) -> int:
        idle_shown: tuple[str, str] | None = None
        while True:
            waiting = [p for p in self.pending() if _whose(p) not in self.voted]
            if not waiting:
                grants = self.grants()
                jobs = self.running()
                listed = running_lines(jobs)
                # Redrawn when the grants or the running jobs change (no redraw every second).
                if (grants, listed) != idle_shown:
                    self.write(
                        CLEAR
                        + "airlock watch: no pending requests; waiting (Ctrl-C quits)\n"
                        + (f"\nlive grants (airlock grants revoke ID ends one):\n{grants}" if grants else "")
                        + (f"\nrunning now ([k] then its number kills it with TERM):\n{listed}" if listed else "")
                    )
                    idle_shown = (grants, listed)
                if self.idle_key(jobs):
                    idle_shown = None
                continue
            idle_shown = None
            self.review(waiting[0], len(waiting))

    def idle_key(self, jobs: list[dict[str, Any]]) -> bool:
        """Wait up to POLL_SECONDS for ``k`` and a job's number; True when the screen needs redrawing."""
        ready, _, _ = select.select([self.fd], [], [], POLL_SECONDS)
        if not ready:
            return False
        data = os.read(self.fd, 256)
        if not jobs or data[:1] not in (b"k", b"K"):
            return False
        # Whatever was typed before this prompt was seen is not an answer.
        termios.tcflush(self.fd, termios.TCIFLUSH)
        self.write("\r\x1b[K" + self.style.bold("kill which job? ") + f"[1-{len(jobs)}], any other key: none ")
        ready, _, _ = select.select([self.fd], [], [], 30)
        choice = os.read(self.fd, 256)[:1] if ready else b""
        if not (choice.isdigit() and 1 <= int(choice) <= len(jobs)):
            self.write("\n" + self.style.yellow("nothing killed") + "\n")
            time.sleep(1.0)
            return True
        job = jobs[int(choice) - 1]
        uid, ref = job.get("agent_uid"), str(job.get("operation_id"))
        reply = self.call("kill", {"ref": f"{uid}/{ref}", "reason": "airlock watch"})
        if reply.get("ok"):
            self.write("\n" + self.style.red("TERM sent to ") + sanitise(ref, strict=True) + "\n")
        else:
            error = reply.get("error") or {}
            self.write(f"\n{self.style.red(sanitise(error.get('code')))}: {sanitise(error.get('message'))}\n")
        time.sleep(1.0)
        return True

    def review(self, p: dict[str, Any], total: int) -> None:
        request_id = str(p.get("request_id"))
        self.write(CLEAR + self.banner(p) + describe(p, self.style, 1, total) + "\n\n")
        # Whatever was typed before the prompt was seen is not an answer.
        termios.tcflush(self.fd, termios.TCIFLUSH)
        key = self.ask(p)
        if key is None:
            self.write("\n" + self.style.yellow("decided elsewhere (or timed out)") + "\n")
            time.sleep(1.0)
            return
        verb = "approve" if key in (b"y", b"Y", b"G") else "deny"
        args: dict[str, Any] = {"id": request_id}
        if verb == "deny":
            reason = self.read_reason(p)
            if reason is None:
                self.write("\n" + self.style.yellow("decided elsewhere (or timed out)") + "\n")
                time.sleep(1.0)
                return
            if reason:
                args["reason"] = reason
        if p.get("expect"):
            args["expect"] = p["expect"]  # the key decides what was on the screen, or nothing (request_changed)
        if key == b"G":
            args["grant_seconds"] = GRANT_SECONDS
        reply = self.call(verb, args)
        data = reply.get("data") or {}
        if reply.get("ok") and data.get("complete") is False:
            self.voted.add(_whose(p))
            self.write(
                "\n" + self.style.green("approval counted") + f" ({sanitise(data.get('progress'))}); "
                f"{sanitise(request_id, strict=True)} waits for more approvers\n"
            )
        elif reply.get("ok"):
            word = self.style.green("approved") if verb == "approve" else self.style.red("denied")
            grant = data.get("grant") or {}
            extra = (
                f" with grant {sanitise(grant.get('grant_id'), strict=True)} (30 min, this command)" if grant else ""
            )
            self.write(f"\n{word} {sanitise(request_id, strict=True)}{extra}\n")
            if verb == "approve":  # issue 35: the running job's output, from any terminal
                self.write(f"follow its output: airlock logs {sanitise(request_id, strict=True)} --follow\n")
        else:
            error = reply.get("error") or {}
            if error.get("code") in ("conflict", "not_found"):
                self.write("\n" + self.style.yellow("decided elsewhere") + "\n")
            else:
                self.write(f"\n{self.style.red(sanitise(error.get('code')))}: {sanitise(error.get('message'))}\n")
        time.sleep(1.0)

    def ask(self, p: dict[str, Any]) -> bytes | None:
        """The first deciding key pressed (y, Y, G, n, N), or None when the request stopped waiting."""
        hint = ""
        while True:
            self.write(
                "\r\x1b[K"
                + self.style.bold("approve? ")
                + f"[y] approve, [G] approve + grant 30m, [n] deny   ({duration(_left(p))} left) {hint}"
            )
            data = self.keys_or_gone(p)
            if data is None:
                return None
            if data[:1] in (b"y", b"Y", b"G", b"n", b"N"):
                return data[:1]
            hint = self.style.yellow("(that key decides nothing: y, G or n)")

    def read_reason(self, p: dict[str, Any]) -> str | None:
        """The deny reason the agent will read, typed on one line (Enter for none); None if it stopped waiting."""
        typed = b""
        while True:
            shown = sanitise(typed.decode("utf-8", "replace"))
            self.write("\r\x1b[K" + self.style.bold("reason for the agent (Enter for none): ") + shown)
            data = self.keys_or_gone(p)
            if data is None:
                return None
            for byte in data:
                if byte in (0x0D, 0x0A):
                    return sanitise(typed.decode("utf-8", "replace")).strip()[:REASON_CHARS]
                if byte in (0x7F, 0x08):
                    typed = typed[:-1]
                elif byte >= 0x20:
                    typed = (typed + bytes([byte]))[: REASON_CHARS * 4]

    def keys_or_gone(self, p: dict[str, Any]) -> bytes | None:
        """What was typed (at least one byte), or None once the request is no longer pending."""
        whose = _whose(p)
        last_poll = time.monotonic()
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if ready:
                data = os.read(self.fd, 256)
                if data:
                    return data
            if time.monotonic() - last_poll >= POLL_SECONDS:
                last_poll = time.monotonic()
                if not any(_whose(q) == whose for q in self.pending()):
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
