"""The fleet console's hosts (issue 49): each host's truth over OpenSSH, and decisions carried back.

A bastion's airlock-web in fleet mode (``web.fleet_hosts``) asks each host
what is pending exactly as `airlock --host` does (`common.sshcall.ssh_argv`:
``ssh -T -o BatchMode=yes`` with ``ControlMaster`` connections reused; the
host's own ``airlock … --json`` on its operator door), and rebuilds its view
from those answers alone (`fleetview.HostView`): it keeps nothing a host
does not have, so two consoles show the same thing and a restart loses
nothing.  A decision is one passkey assertion over a group
(`approval.groups`), carried to each member host by ``airlock passkey
carry`` on stdin; each host's approval verifies it itself.  The SSH login
on the hosts should be an observer there: it reads, carries, and decides
nothing by itself (docs/fleet.md, docs/security.md).

Every wait is bounded: a call waits `CALL_TIMEOUT` at most, and at most
`PARALLEL` SSH processes run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

from airlock.common import groups
from airlock.common.errors import AirlockError
from airlock.common.log import get as get_logger
from airlock.common.sshcall import check_host, ssh_argv
from airlock.common.wire import operator as op
from airlock.common.wire import passkey as pk
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Empty, Verb
from airlock.web import fleetview
from airlock.web.fleetview import HostView, RelayMark, Row

CALL_TIMEOUT: Final = 30.0
PARALLEL: Final = 32  # ssh processes at once (each host's connection is shared across its calls)
MAX_REPLY: Final = 16 * 1024 * 1024
A = TypeVar("A", bound=Message)

log = get_logger("airlock.web.fleet")


def unreachable(message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": "unreachable", "message": message, "details": {}}}


def command(verb: Verb[A, Any], args: A) -> tuple[list[str], bytes | None]:
    """The host's ``airlock`` command line that calls ``verb`` (only what the console calls), and its stdin."""
    if verb is op.PENDING:
        return ["pending", "--json"], None
    if verb is op.RUNNING:
        return ["running", "--json"], None
    if verb is op.STATUS:
        return ["status", "--json"], None
    if verb is op.STATEMENT:
        said = args.to_dict()
        deny = ["--deny"] if said.get("decision") == "deny" else []
        return ["statement", "--json", *deny, "--", str(said["id"])], None
    for name, carried in op.CARRIED.items():
        if verb is carried:  # the passkey verbs: their message as JSON on stdin (`airlock passkey carry`)
            return ["passkey", "carry", "--verb", name, "--json"], json.dumps(args.to_dict()).encode("utf-8")
    raise ValueError(f"the fleet console does not call {verb.name!r}")


class Fleet:
    """The hosts, each host's last answer, and decisions carried to them."""

    def __init__(self, hosts: Sequence[str], ssh_config: str | None = None) -> None:
        self.hosts = [check_host(h) for h in dict.fromkeys(hosts)]
        self.ssh_config = ssh_config
        self.control_dir = tempfile.mkdtemp(prefix="airlock-fleet-ssh-")
        self.views: dict[str, HostView] = {h: HostView(h) for h in self.hosts}
        self.relays: dict[str, RelayMark] = {}  # each host's newest signed relay post (news, never the truth)
        self.collected: dict[str, dict[str, Any]] = {}  # the collector's verdict per host (`fleetaudit`)
        self._gate = asyncio.Semaphore(PARALLEL)

    def _control(self, host: str) -> str:
        return os.path.join(self.control_dir, f"h{self.hosts.index(host)}")

    async def call(self, host: str, verb: Verb[A, Any], args: A) -> dict[str, Any]:
        """The envelope the host's ``airlock … --json`` printed for ``verb``; SSH trouble as an ``unreachable`` one."""
        argv, stdin = command(verb, args)
        ssh = ssh_argv(host, argv, config=self.ssh_config, control=self._control(host))
        async with self._gate:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *ssh,
                    stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            except FileNotFoundError:
                return unreachable("the OpenSSH client is not installed")
            try:
                out, err = await asyncio.wait_for(proc.communicate(stdin), CALL_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                return unreachable(f"no answer within {CALL_TIMEOUT:g}s")
        for line in reversed(out[:MAX_REPLY].decode("utf-8", "replace").splitlines()):
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    envelope = json.loads(line)
                    if isinstance(envelope, dict) and "ok" in envelope:
                        return envelope
                break
        why = (err.decode("utf-8", "replace").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return unreachable(("ssh: " if proc.returncode == 255 else "airlock: ") + why)

    async def refresh(self, hosts: Iterable[str] | None = None) -> None:
        """Ask each host (all, or these) what is pending now, and the statements it published for them."""
        await asyncio.gather(*(self._refresh(h) for h in (self.hosts if hosts is None else hosts)))

    async def _refresh(self, host: str) -> None:
        reply, jobs, status = await asyncio.gather(
            self.call(host, op.PENDING, Empty()),
            self.call(host, op.RUNNING, Empty()),
            self.call(host, op.STATUS, Empty()),
        )
        if not reply.get("ok"):
            error = reply.get("error") or {}
            self.views[host] = HostView(host, error=f"{error.get('code')}: {error.get('message')}")
            log.warning("web.fleet.host_failing", host=host, code=error.get("code"))
            return
        pending = [p for p in (reply.get("data") or {}).get("pending") or [] if isinstance(p, dict)]
        wanted = {
            p["request_id"]: int(p.get("expires") or 0)
            for p in pending
            if isinstance(p.get("request_id"), str) and not p.get("attached_to")
        }
        # A statement is fixed while its request waits; asked again (or approval restarted) it gets a new
        # nonce and expiry: a known statement is kept only while its expiry is the request's.  The others
        # are asked for at once (`PARALLEL` bounds the ssh processes).
        known = {
            rid: text
            for rid, text in self.views[host].statements.items()
            if fleetview.expires_of(text) == wanted.get(rid)
        }
        new = [rid for rid in wanted if rid not in known]
        found = dict(zip(new, await asyncio.gather(*(self.statement(host, rid, "allow") for rid in new)), strict=True))
        statements = {rid: text for rid in wanted if (text := known.get(rid) or found.get(rid)) is not None}
        fleetview.warm(statements.values())
        running = [j for j in (jobs.get("data") or {}).get("running") or [] if isinstance(j, dict)]
        if not jobs.get("ok") or not status.get("ok"):  # an older host, or its runner down: pending still shows
            log.warning(
                "web.fleet.host_partial", host=host, running=bool(jobs.get("ok")), status=bool(status.get("ok"))
            )
        data = status.get("data")
        held: dict[str, Any] = data if status.get("ok") and isinstance(data, dict) else {}
        self.views[host] = HostView(host, tuple(pending), statements, "", time.time(), tuple(running), held)

    def relayed(self, host: str, message: Mapping[str, Any], now: float) -> None:
        """A host's signed relay post: its seq and event time, kept when newer (at least once: repeats come)."""
        seq = message.get("seq") if isinstance(message.get("seq"), int) else None
        known = self.relays.get(host)
        if known is not None and seq is not None and known.seq is not None and seq < known.seq:
            return
        self.relays[host] = RelayMark(seq, fleetview.event_time(message.get("time")), now)

    async def act_begin(self, host: str, args: pk.ActBegin) -> dict[str, Any]:
        """``host``'s action statement for a person's touch (`airlock passkey carry --verb act_begin`)."""
        return await self.call(host, op.PASSKEY_ACT_BEGIN, args)

    async def act(self, host: str, args: pk.Act) -> dict[str, Any]:
        """The touch carried to ``host``, which checks it and acts (`airlock passkey carry --verb act`)."""
        reply = await self.call(host, op.PASSKEY_ACT, args)
        log.info("web.fleet.acted", host=host, ok=bool(reply.get("ok")))
        await self.refresh([host])
        return reply

    async def statement(self, host: str, request_id: str, decision: str) -> str | None:
        """The statement ``host`` publishes now for one decision of a pending request (None if it has none)."""
        reply = await self.call(host, op.STATEMENT, op.Statement(request_id, decision=decision))
        text = (reply.get("data") or {}).get("statement") if reply.get("ok") else None
        if not isinstance(text, str) or not text.isascii():
            log.warning("web.fleet.no_statement", host=host, request_id=request_id)
            return None
        return text

    async def begin(self, row: Row, decision: str, extras: bytes) -> tuple[groups.Group, list[dict[str, Any]]]:
        """The group one touch signs for ``row`` (the deny statements asked of the hosts for a deny)."""
        members = [{"host": m.host, "id": m.request_id, "statement": m.statement} for m in row.members]
        if decision == "deny":
            found = await asyncio.gather(*(self.statement(m.host, m.request_id, "deny") for m in row.members))
            members = [dict(m, statement=s) for m, s in zip(members, found, strict=True) if s is not None]
        return groups.of(str(m["statement"]).encode("ascii") for m in members), members

    async def carry(
        self,
        group: Mapping[str, Any],
        members: Sequence[Mapping[str, Any]],
        decision: str,
        credential: object,
        **kw: Any,
    ) -> dict[str, dict[str, Any]]:
        """One assertion carried to each member's host (``airlock passkey carry``); each host's reply."""

        async def one(m: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
            said = {"id": m["id"], "decision": decision, "statement": m["statement"], "group": dict(group)}
            try:  # what the browser sent, checked as each host's door checks it before it is carried
                args = pk.Decide.from_dict(said | kw | {"credential": credential})
            except AirlockError as exc:
                return str(m["host"]), {"ok": False, "error": exc.to_dict()}
            reply = await self.call(str(m["host"]), op.PASSKEY_DECIDE, args)
            log.info("web.fleet.carried", host=m["host"], request_id=m["id"], ok=bool(reply.get("ok")))
            return str(m["host"]), reply

        done = await asyncio.gather(*(one(m) for m in members if m.get("host") in self.views))
        await self.refresh({h for h, _ in done})
        return dict(done)

    async def close(self) -> None:
        for host in self.hosts:
            config = ["-F", self.ssh_config] if self.ssh_config else []
            argv = ["ssh", *config, "-o", f"ControlPath={self._control(host)}", "-O", "exit", host]
            with contextlib.suppress(OSError, TimeoutError):
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                await asyncio.wait_for(proc.wait(), 10)
        shutil.rmtree(self.control_dir, ignore_errors=True)
