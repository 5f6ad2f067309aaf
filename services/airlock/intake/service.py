"""airlock-intake: the agents' front door.

Reads one request from ``agent.sock``, identifies the peer, runs every gate
(cap, peer, framing, shape, fields, freshness, environment, replay), then
hands it to `airlock.intake.drive` (journal -> approval -> runner -> journal)
and replies in the dialect it was asked in (native v1 or reference/000).
The native verbs' table is built from the agent door's declarations
(`airlock.common.wire.agent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pwd
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airlock import __version__
from airlock.common import daemon, log, validate
from airlock.common.audit import lifecycle
from airlock.common.codec import (
    SUPPORTED_VERSIONS,
    Request,
    encode_error,
    parse_object,
    recover_id,
)
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import AllowList, Peer, may_decide
from airlock.common.server import Call, Connection, Door, Service, Verb, linger
from airlock.common.spec import check_privilege
from airlock.common.wire import agent as agent_door
from airlock.common.wire import approval as wire_approval
from airlock.common.wire import verb as wire
from airlock.common.wire.message import Public
from airlock.common.wire.verb import Stub
from airlock.intake import fileop_request, sudo_proxy
from airlock.intake.drive import Drive
from airlock.intake.request import legacy_exec, legacy_id, native_exec, parse_time
from airlock.intake.work import asking, file_work, peer_facts

NAME = "intake"
# The agent door's verbs, in the order `hello` lists them, and those whose work runs in a session:
# both from the door's declarations (common/wire/agent.py).
NATIVE_VERBS = agent_door.VERBS
SESSION_VERBS = agent_door.SESSION_VERBS


class Intake:
    """The agent door: tells the two dialects apart, serves the native verbs, guards them; `Drive` does the rest."""

    def __init__(self, config: Config, service: Service, drive: Drive) -> None:
        self.config = config
        self.service = service
        self.drive = drive
        self.approval = drive.approval  # the door's own question to approval: `can` (explain)
        self.runner_uid = drive.runner_uid
        self.log = log.get()

    # --- the connection: one dialect per line ------------------------------------

    async def handle(self, conn: Connection) -> None:
        while True:
            try:
                line = await conn.read_line()
            except AirlockError as exc:
                await self._framing_error(conn, exc)
                return
            if line is None:
                return
            try:
                obj = parse_object(line)
            except AirlockError as exc:
                dialect, rid = sudo_proxy.sniff(line)
                reply = encode_error(rid, exc) if dialect == "native" else sudo_proxy.encode_undetermined(rid, exc)
                await conn.send(reply)
                self.log.info("intake.request.malformed", peer_uid=conn.peer.uid, code=exc.code.value)
                continue
            if sudo_proxy.is_legacy(obj):
                # reference/000: one request per connection.
                await conn.send(await self._legacy(conn, obj))
                return
            await conn.send(await self.service.dispatch(conn, line, obj=obj))

    async def _framing_error(self, conn: Connection, exc: AirlockError) -> None:
        raw = conn.decoder.peek(64 * 1024)
        dialect, rid = sudo_proxy.sniff(raw)
        if exc.code is ErrorCode.MISSING_NEWLINE and raw:
            try:
                obj = parse_object(raw)
                dialect = "legacy" if sudo_proxy.is_legacy(obj) else "native"
                rid = recover_id(obj)
            except AirlockError:
                pass
        self.log.info("intake.request.rejected", peer_uid=conn.peer.uid, code=exc.code.value)
        if not raw:
            # Nothing was sent (the handshake deadline): either dialect's client may be waiting.
            reply = sudo_proxy.encode_undetermined(None, exc)
        else:
            reply = encode_error(rid, exc) if dialect == "native" else sudo_proxy.encode_error(rid, exc)
        try:
            await conn.send(reply)
        except ConnectionError:
            return
        # A client still writing a huge request must get to read its error:
        # closing with unread bytes would reset the connection under it.
        await linger(conn.reader, conn.writer, budget=16 * 1024 * 1024, seconds=5.0)

    # --- native v1: the agent door's verb table and its guard ----------------------

    def verbs(self) -> dict[str, Verb]:
        """The agent door's table (served by `Service.dispatch`), built from its declarations.

        Each verb's arguments arrive as its declared message (`wire.agent`);
        intake's pure parsers check what is the request's own (`intake.request`,
        `intake.fileop_request`); the door admits only agents, so no per-verb
        caller check is needed.
        """
        handlers: dict[wire.Verb[Any, Any], wire.Handler[Any, Any]] = {
            agent_door.EXEC: self._exec,
            agent_door.PING: self._ping,
            agent_door.HELLO: self._hello,
            agent_door.CANCEL: self._cancel,
            agent_door.APPROVE_SIGNED: self._approve_signed,
            agent_door.CAN: self._can,
        }
        handlers.update(dict.fromkeys(agent_door.FILES, self._files))
        return wire.serve(agent_door.DOOR, handlers)

    async def guard(self, request: Request, conn: Connection) -> Request:
        """Every native request passes here before its verb runs: scope, then the token.

        An operator verb gets the refusal a bad token gets, so a probe learns
        nothing about what the operator door offers.  A token's session is the
        only one that counts, for every verb: a request naming another session
        is refused (silently replacing it would hide the agent's confusion or
        probe), and exec and the file verbs run in the token's.
        """
        if request.verb not in NATIVE_VERBS:
            # Loaded by the first refusal, not at start: the operator door's declarations (and the passkey
            # messages they carry) are ~50 dataclasses intake never serves (issue 50: its cold start).
            from airlock.common.wire import operator as operator_door

            if request.verb in operator_door.VERBS:
                raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
            raise AirlockError(ErrorCode.UNKNOWN_VERB, f"unknown verb {request.verb!r}", {"verbs": list(NATIVE_VERBS)})
        validate.displayed(request.args)  # issue 45: every field a person may read, unknown ones too
        session = await self.drive.check_token(request, conn.peer)
        if session is None:
            return request
        claimed = request.args.get("session")
        if claimed not in (None, "", session):
            raise AirlockError(
                ErrorCode.INVALID_ARGUMENTS,
                "session: the request names a session other than its token's; a token's session is the only one "
                "its requests may use (leave session out)",
                {"field": "session"},
            )
        if request.verb in SESSION_VERBS:
            return dataclasses.replace(request, args=request.args | {"session": session})
        return request

    async def _exec(self, call: Call, args: agent_door.Exec) -> agent_door.Evidence:
        exec_request = native_exec(call.request.id, args.to_dict(), call.peer, self.config, time.time(), account_uid)
        return agent_door.Evidence(
            await self.drive.run(exec_request, call.peer, call if exec_request.stream else None, conn=call.connection)
        )

    async def _files(self, call: Call, args: Public) -> agent_door.Evidence:
        file_request = fileop_request.native_files(
            call.request.verb, call.request.id, args.to_dict(), call.peer, self.config, time.time()
        )
        work = file_work(file_request, self.config)
        return agent_door.Evidence(await self.drive.run_work(work, call.peer, None, conn=call.connection))

    async def _can(self, call: Call, args: agent_door.Exec) -> wire_approval.Explained:
        """An agent's `sudo -l -- CMD` (issue 32): what the policy would do with this exec request, nothing run.

        The request is checked exactly as ``exec`` checks it (fields, freshness,
        the environment rules), so the answer is about the request the agent
        would really send; approval explains only what decides it.
        """
        req = native_exec(call.request.id, args.to_dict(), call.peer, self.config, time.time(), account_uid)
        check_privilege(req.spec.run_as, self.runner_uid, privileged=req.spec.privileged)
        explain = wire_approval.Explain(asking(req), peer_facts(call.peer), req.spec.to_dict())
        return await Stub(wire_approval.DOOR, self.approval).call(wire_approval.EXPLAIN, explain, timeout=30)

    async def _approve_signed(self, call: Call, args: agent_door.ApproveSigned) -> wire_approval.SignedVote:
        return await self.drive.approve_signed(args, call.peer)

    async def _cancel(self, call: Call, args: agent_door.Cancel) -> agent_door.Cancelled:
        return await self.drive.cancel(args.operation_id, call.peer)

    async def _hello(self, call: Call, args: agent_door.Control) -> agent_door.Hello:
        if args.time is not None:  # without a time: a plain health check
            await self._fresh(call.request.id, args.time, call.peer)
        return self.hello()

    async def _ping(self, call: Call, args: agent_door.Control) -> agent_door.Pong:
        if args.time is not None:
            await self._fresh(call.request.id, args.time, call.peer)
        return agent_door.Pong("pong", __version__)

    def hello(self) -> agent_door.Hello:
        return agent_door.Hello(
            "airlock",
            __version__,
            tuple(SUPPORTED_VERSIONS),
            tuple(NATIVE_VERBS),
            ("native-v1", "sudo-proxy"),
            # What an agent's `sudo -E` may carry, and how long its retry joins (issue 48: cli/sudo.py).
            tuple(self.config.env.allow),
            self.config.agents.retry_window_seconds,
        )

    def _may_stop(self, peer: Peer) -> bool:
        """Only root or a full operator (not an observer) may stop the shared intake."""
        operators = self.config.operators
        return may_decide(peer, operators.users, operators.groups, operators.observers.users)

    async def _control_gates(self, request_id: str | None, args: dict[str, Any], peer: Peer, *, native: bool) -> None:
        """Control actions pass the same gates as exec: fields, freshness, replay."""
        for key in ("session", "host", "reason"):
            if args.get(key) is not None:
                validate.text(key, args[key], max_len=4096)
        if native and args.get("time") is None:
            return  # a native ping/hello without a time is a plain health check
        await self._fresh(request_id, args.get("time"), peer)

    async def _fresh(self, request_id: str | None, sent: Any, peer: Peer) -> None:
        """A control action's time: fresh (reference/000 requires one), and its ID claimed (replay)."""
        parse_time(sent, self.config, time.time())
        if request_id:
            await self.drive.claim(request_id, peer)

    # --- reference/000 ----------------------------------------------------------

    async def _legacy(self, conn: Connection, obj: dict[str, Any]) -> bytes:
        raw_id = obj.get("id")
        request_id = raw_id if validate.is_request_id(raw_id) else None  # a refused ID is not echoed
        try:
            request_id = legacy_id(obj)
            validate.displayed(obj)  # issue 45: every field a person may read, unknown ones (version) too
            if self.config.agents.require_token:
                raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")  # this dialect carries no token
            action = obj.get("action", "exec")
            if action in ("ping", "stop"):
                if obj.get("pipeline") not in (None, []):
                    raise validate.bad("pipeline", f"must be empty for the {action} action")
                if action == "stop" and not self._may_stop(conn.peer):
                    # sudo-proxy's daemon serves one user, so its stop is that user's; airlock's
                    # intake serves every agent: stopping it cuts the others' requests.
                    self.log.warning("intake.stop.refused", peer_uid=conn.peer.uid, peer_pid=conn.peer.pid)
                    raise AirlockError(
                        ErrorCode.UNAUTHORIZED,
                        "the stop action is an operator's: this intake serves every agent on the host "
                        "(an operator runs `systemctl stop airlock-intake`)",
                    )
                await self._control_gates(request_id, obj, conn.peer, native=False)
                if action == "stop":
                    self.log.info("intake.stop.requested", peer_uid=conn.peer.uid, peer_pid=conn.peer.pid)
                    asyncio.get_running_loop().call_soon(self.service.request_stop, "stop action")
                    return sudo_proxy.encode_ok(request_id, "stopping")
                return sudo_proxy.encode_ok(request_id, "pong")
            if action != "exec":
                raise validate.bad("action", f"unknown action {action!r} (known: exec, ping, stop)")
            now = time.time()
            exec_request = legacy_exec(obj, conn.peer, self.config, now)
            return sudo_proxy.encode_result(request_id, await self.drive.run(exec_request, conn.peer, None, conn=conn))
        except AirlockError as exc:
            return sudo_proxy.encode_error(request_id, exc)
        except Exception as exc:
            self.log.exception("intake.request.failed", request_id=request_id, error=repr(exc))
            return sudo_proxy.encode_error(
                request_id, AirlockError(ErrorCode.INTERNAL, "internal error; see the service log")
            )


def account_uid(name: str) -> int | None:
    """An exec's ``user`` (issue 48: a name, ``#uid`` as sudo -u takes it, or a uid): its uid from passwd."""
    try:
        if name.lstrip("#").isdigit():
            return pwd.getpwuid(int(name.lstrip("#"))).pw_uid
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError, OverflowError):
        return None
    except OSError as exc:  # the database could not be read: that says nothing about the account
        raise AirlockError(
            ErrorCode.IDENTITY_UNAVAILABLE, f"user: the user database could not be read ({exc})"
        ) from None


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    door = Door(
        "agent",
        allow=AllowList.of(config.agents.users, config.agents.groups, empty_means_all=True),
        max_line=config.limits.max_request_bytes,
        max_connections=config.limits.max_connections,
        max_per_peer=config.limits.connections_per_agent,
        refusal=lambda exc: sudo_proxy.encode_undetermined(None, exc),
    )
    service = Service(NAME, config, [door])
    drive = Drive(config)
    intake = Intake(config, service, drive)
    door.handler = intake.handle  # tells the two dialects apart; native requests go to dispatch
    door.verbs = intake.verbs()
    door.guard = intake.guard
    lifecycle(service, drive.audit)
    journal_started = service.on_started

    async def started() -> None:
        # Cold start (issue 21): the first request needs the journal, approval and the
        # runner, each started by its socket on its first connection.  Knock on all three
        # now, so that systemd starts them side by side instead of one after the other.
        for name in ("journal", "approval", "runner"):
            asyncio.get_running_loop().create_task(_knock(config.socket_path(name)))
        if journal_started is not None:
            await journal_started()

    service.on_started = started
    return service


async def _knock(path: Path) -> None:
    """Connect and hang up: under socket activation that starts the service behind ``path``."""
    with contextlib.suppress(OSError, TimeoutError):
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 5)
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 5)


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)
