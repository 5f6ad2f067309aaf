"""`airlock --host [USER@]HOST …` and `airlock watch --host A --host B`: operators on other hosts, over OpenSSH.

The choice (docs/fleet.md explains it): the remote host's own ``airlock``
runs the command, started by ``ssh -T -o BatchMode=yes`` -- not the operator
socket forwarded with ``ssh -L``.  So the remote host's peer checks decide
who may approve, exactly as for a local operator: the SSH login *is* the
operator (its uid and groups reach operator.sock through SO_PEERCRED); no
new credential, no socket left listening on the operator's machine, nothing
that reaches operator.sock but a login that could have typed the command
there.  A multi-host console asks for ``--json`` envelopes (one per call) and
labels each request with its host.

Every call is bounded: ``ConnectTimeout`` and keep-alives bound a dead
network; the console's polls and decisions also have a wall-clock timeout.
Connections are shared per host (``ControlMaster=auto`` with a private
``ControlPath`` for the console's lifetime), so polling every few seconds
costs one login per host, not one per poll.  ``BatchMode`` means ssh never
prompts: keys come from an agent or unencrypted key files, host keys must be
known already (StrictHostKeyChecking stays as the user configured it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import termios
import time
import tty
from collections.abc import Sequence
from typing import Any, Final

from airlock.cli import watch
from airlock.common import client
from airlock.common.render import sanitise
from airlock.common.sshcall import check_host as check_host  # shared with the fleet console (issue 49)
from airlock.common.sshcall import ssh_argv as ssh_argv
from airlock.common.wire import operator as op
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Empty, Verb

CALL_TIMEOUT: Final = 30.0
FLEET_POLL_SECONDS: Final = 2.0
ROUND_SECONDS: Final = 1.5  # how long one round waits for the hosts' answers before showing what it has
RETRY_SECONDS: Final = 10.0  # a failing host is asked again after this long


def strip_global(argv: Sequence[str]) -> list[str]:
    """``argv`` without the options that choose the host (they stay here, the rest runs there)."""
    out: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("--host", "--ssh-config"):
            i += 2
            continue
        if not argv[i].startswith(("--host=", "--ssh-config=")):
            out.append(argv[i])
        i += 1
    return out + list(argv[i:])


def run_remote(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    """`airlock --host H CMD …`: the same command, run by H's airlock; its output and exit status."""
    hosts = list(ns.remote_hosts or [])
    if getattr(ns, "cmd", None) == "watch":
        hosts += getattr(ns, "watch_hosts", None) or []
        return watch_hosts(hosts, getattr(ns, "watch_ssh_config", None) or ns.ssh_config)
    if len(hosts) != 1:
        print("airlock: --host takes one host, except for watch", file=sys.stderr)
        return 2
    try:
        command = ssh_argv(hosts[0], strip_global(argv), config=ns.ssh_config)
    except ValueError as exc:
        print(f"airlock: {exc}", file=sys.stderr)
        return 2
    try:
        rc = subprocess.run(command, check=False).returncode  # noqa: S603  ssh with an argv ssh_argv built; the host was checked not to be an option
    except FileNotFoundError:
        print("airlock: --host needs the OpenSSH client (apt-get install openssh-client)", file=sys.stderr)
        return 2
    if rc == 255:
        print(f"airlock: {sanitise(hosts[0])}: ssh could not run the command (see its message above)", file=sys.stderr)
    return rc


# -- the multi-host console -------------------------------------------------------------


class Remote:
    """One host's operator verbs, as envelopes from its ``airlock … --json`` over a shared SSH connection."""

    def __init__(self, host: str, config: str | None, control_dir: str) -> None:
        self.host = check_host(host)
        self.config = config
        self.control = os.path.join(control_dir, f"c{abs(hash(host)) % 10**8}")

    def command(self, verb: Verb[Any, Any], message: Message) -> list[str]:
        """The ``airlock`` command line that calls ``verb`` on the host (only what the console calls)."""
        args = message.to_dict()
        if verb is op.PENDING:
            return ["pending", "--json"]
        if verb in (op.APPROVE, op.DENY):
            expect = ["--expect", str(args["expect"])] if args.get("expect") else []
            return [
                verb.name,
                "--json",
                "--reason",
                str(args.get("reason") or "airlock watch"),
                *expect,
                "--",
                str(args["id"]),
            ]
        raise ValueError(f"unknown verb {verb.name!r}")

    def call(self, verb: Verb[Any, Any], args: Message) -> dict[str, Any]:
        """The remote envelope; SSH trouble becomes an ``unreachable`` envelope, never an exception."""
        argv = ssh_argv(self.host, self.command(verb, args), config=self.config, control=self.control)
        try:
            proc = subprocess.run(  # noqa: S603  ssh, argv from ssh_argv
                argv,
                capture_output=True,
                text=True,
                timeout=CALL_TIMEOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return _unreachable(f"no answer within {CALL_TIMEOUT:g}s")
        except FileNotFoundError:
            return _unreachable("the OpenSSH client is not installed")
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith("{"):
                try:
                    envelope = json.loads(line)
                except ValueError:
                    break
                if isinstance(envelope, dict) and "ok" in envelope:
                    return envelope
                break
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return _unreachable(("ssh: " if proc.returncode == 255 else "airlock: ") + why)

    def close(self) -> None:
        argv = ["ssh", "-o", f"ControlPath={self.control}", "-O", "exit", self.host]
        if self.config:
            argv[1:1] = ["-F", self.config]
        subprocess.run(argv, capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL)  # noqa: S603  ssh -O exit on our own control socket


def _unreachable(message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": "unreachable", "message": message, "details": {}}}


class FleetConsole(watch.Console):
    """`watch.Console` over several hosts: one queue, each request labelled with its host and
    decided on it; a host that fails is shown failing and the others go on."""

    def __init__(self, remotes: Sequence[Remote], fd: int, out: Any) -> None:
        super().__init__(self._route, fd, out)
        self.remotes = {r.host: r for r in remotes}
        self.failing: dict[str, str] = {}
        self._held: dict[str, list[dict[str, Any]]] = {}  # each host's last answer
        self._inflight: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        self._next_poll: dict[str, float] = {}
        self._current: str | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(remotes)))

    def _route(self, verb: Verb[Any, Any], args: Message) -> dict[str, Any]:
        host = self._current
        if verb is op.PENDING or host is None:
            raise AssertionError("pending goes through FleetConsole.pending")
        return self.remotes[host].call(verb, args)

    def pending(self) -> list[dict[str, Any]]:
        """Every host's pending requests, labelled, the soonest to expire first.

        Polls run in the background, one per host at a time: a host that is
        slow to answer (a black-holed address waits out ``ConnectTimeout``)
        keeps its last answer and never holds up the others; a failing host
        is asked again after `RETRY_SECONDS`.
        """
        now = time.monotonic()
        for host, r in self.remotes.items():
            if host not in self._inflight and now >= self._next_poll.get(host, 0.0):
                self._inflight[host] = self._pool.submit(r.call, op.PENDING, Empty())
        concurrent.futures.wait(list(self._inflight.values()), timeout=ROUND_SECONDS)
        for host, future in list(self._inflight.items()):
            if not future.done():
                continue
            del self._inflight[host]
            reply = future.result()
            if not reply.get("ok"):
                error = reply.get("error") or {}
                self.failing[host] = f"{error.get('code')}: {error.get('message')}"
                self._held.pop(host, None)
                self._next_poll[host] = time.monotonic() + RETRY_SECONDS
                continue
            self.failing.pop(host, None)
            self._held[host] = [dict(p, fleet_host=host) for p in (reply.get("data") or {}).get("pending") or []]
        items = [p for host in self.remotes for p in self._held.get(host, [])]
        items.sort(key=lambda p: float(p.get("expires") or 0) or float("inf"))
        return items

    def status(self) -> str:
        lines = []
        for host in self.remotes:
            if host in self.failing:
                lines.append(self.style.red(f"{sanitise(host)}: FAILING ") + sanitise(self.failing[host]))
            elif host in self._held:
                lines.append(f"{sanitise(host)}: ok, {len(self._held[host])} pending")
            else:
                lines.append(f"{sanitise(host)}: connecting")
        return "\n".join(lines)

    def banner(self, p: dict[str, Any]) -> str:
        return self.style.bold(f"on host {sanitise(p.get('fleet_host'))}") + "\n" + self.status() + "\n\n"

    def review(self, p: dict[str, Any], total: int) -> None:
        self._current = str(p.get("fleet_host"))
        try:
            super().review(p, total)
        finally:
            self._current = None

    def run(self) -> int:
        shown = ""
        while True:
            waiting = self.pending()
            if not waiting:
                screen = (
                    watch.CLEAR
                    + "airlock watch: no pending requests on any host; waiting (Ctrl-C quits)\n"
                    + self.status()
                    + "\n"
                )
                if screen != shown:
                    self.write(screen)
                    shown = screen
                time.sleep(FLEET_POLL_SECONDS)
                continue
            shown = ""
            self.review(waiting[0], len(waiting))


def watch_hosts(hosts: Sequence[str], config: str | None) -> int:
    """`airlock watch --host A --host B …`."""
    if not sys.stdin.isatty():
        print("airlock: watch needs a terminal on stdin", file=sys.stderr)
        return 1
    control_dir = tempfile.mkdtemp(prefix="airlock-ssh-")
    try:
        remotes = [Remote(h, config, control_dir) for h in dict.fromkeys(hosts)]
    except ValueError as exc:
        print(f"airlock: {exc}", file=sys.stderr)
        return 2
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    console = FleetConsole(remotes, fd, sys.stdout)
    # A closed terminal (SIGHUP) still closes the shared SSH connections below.
    signal.signal(signal.SIGHUP, lambda _sig, _frame: sys.exit(129))
    try:
        tty.setcbreak(fd)
        return console.run()
    except client.ClientError as exc:
        print(f"\nairlock: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        console._pool.shutdown(wait=False, cancel_futures=True)
        for r in remotes:
            r.close()
        for name in os.listdir(control_dir):
            os.unlink(os.path.join(control_dir, name))
        os.rmdir(control_dir)
