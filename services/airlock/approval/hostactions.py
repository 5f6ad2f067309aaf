"""A person's kill, hold or release carried from a fleet console (issue 49), verified here before it acts.

The console's SSH login is an observer: ``kill``, ``hold`` and ``release``
answer it ``unauthorized``.  What it may carry instead is a person's passkey
assertion over an *action statement this host made*:

- ``passkey.act_begin`` (any caller of the passkey verbs) makes the statement
  (`common.actions.render`: this host's name, the action, for a kill the job
  the runner says the reference names now, the signal and reason, a fresh
  nonce and an expiry) and keeps it here under a random challenge ID, for
  `ACT_SECONDS` at most, once;
- ``passkey.act`` takes the challenge ID, the list of statement digests one
  touch signed (several hosts' statements: "hold every host"), and the
  assertion.  The statement is spent whatever comes next; this host's digest
  must be in the list; the assertion must verify over the challenge
  recomputed from the list (`assertions.Credentials.verified`: origin, RP ID,
  user verification, signature, counter, never used before) and be an
  operator's passkey.  Then it acts as that person, and the journal names
  the person, ``method: passkey``, the credential and the carrier.

So the console can ask for statements and carry touches; an assertion made
for another host, another job or an earlier statement verifies over
nothing here.  Refusals are journaled (``passkey.refused``) and rated per
carrier, as refused decisions are.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass
from typing import Any, Final, Protocol

from airlock.approval import webauthn
from airlock.approval.assertions import no, refused
from airlock.approval.passkeys import Passkeys, person_of
from airlock.approval.tickets import TicketBook
from airlock.approval.webauthn import Refused
from airlock.common import actions
from airlock.common.audit import Ids
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.common.server import Call
from airlock.common.wire import passkey as pk
from airlock.common.wire import runner as runner_wire

ACT_SECONDS: Final = 300.0  # a statement waits this long for its touch (WebAuthn's own timeout is 120 s)
MAX_OPEN: Final = 256  # action statements waiting at once; more are refused, none is evicted


class Killing(Protocol):
    """What `HostActions` needs of the operators' kill (`operator.Operating`)."""

    async def kill_target(
        self, who: Peer, ref: str, signame: str | None, reason: str
    ) -> tuple[runner_wire.Kill, dict[str, Any]]: ...

    async def kill_dry(self, kill: runner_wire.Kill) -> dict[str, Any]: ...

    async def kill_as(
        self, who: Peer, kill: runner_wire.Kill, job: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> runner_wire.Killed: ...


@dataclass(frozen=True, slots=True)
class Open:
    """An action statement waiting for its touch."""

    statement: str
    action: str
    expires: float
    reason: str
    kill: runner_wire.Kill | None = None
    job: dict[str, Any] | None = None


class HostActions:
    """``passkey.act_begin`` and ``passkey.act``: the fleet console's kill, hold and release, a person's touch each."""

    def __init__(self, passkeys: Passkeys, killing: Killing, book: TicketBook) -> None:
        self.passkeys = passkeys
        self.killing = killing
        self.book = book
        self.open: dict[str, Open] = {}

    def _prune(self, now: float) -> None:
        for key in [k for k, o in self.open.items() if o.expires <= now]:
            del self.open[key]

    async def act_begin(self, call: Call, args: pk.ActBegin) -> pk.ActChallenge:
        _origin, rp_id = self.passkeys.keys.web()
        now = time.time()
        self._prune(now)
        if len(self.open) >= MAX_OPEN:
            raise AirlockError(ErrorCode.CONFLICT, "too many action statements wait for a touch; try again shortly")
        reason = args.reason or ""
        fields = {"host": self.passkeys.host, "action": args.action}
        kill = job = None
        if args.action == "kill":
            assert args.ref is not None
            # The job as the runner names it now: the statement binds that operation, not a reference
            # that could name another job by the time the touch comes back.
            kill, job = await self.killing.kill_target(call.peer, args.ref, args.signal, reason)
            # Bound to that operation of that agent from now on (a request ID could be reused by then).
            kill = dataclasses.replace(kill, ref=str(job["operation_id"]), uid=int(job["agent_uid"]))
            fields |= {
                "request": str(job.get("request_id") or ""),
                "operation": str(job.get("operation_id") or ""),
                "agent_uid": str(job.get("agent_uid")),
                "signal": str(args.signal or "TERM"),
            }
        fields |= {"reason": reason, "nonce": secrets.token_hex(16), "expires": str(int(now + ACT_SECONDS))}
        statement = actions.render(fields)
        challenge_id = secrets.token_urlsafe(24)
        self.open[challenge_id] = Open(statement, args.action, now + ACT_SECONDS, reason, kill, job)
        mine = actions.digest(statement)
        options = webauthn.request_options(rp_id, actions.challenge([mine]), self.passkeys.keys.deciders())
        return pk.ActChallenge(challenge_id, statement, mine, int(now + ACT_SECONDS), options)

    async def act(self, call: Call, args: pk.Act) -> pk.Acted:
        keys = self.passkeys.keys
        keys.web()
        self.passkeys.passkey_refusals.check(call.peer.uid)
        carrier = {"uid": call.peer.uid, "user": call.peer.user}
        found = self.open.pop(args.challenge_id, None) if isinstance(args.challenge_id, str) else None  # once
        credential_id: str | None = None
        try:
            if found is None or found.expires <= time.time():
                raise no("challenge", "no such action statement (or it expired, or was used)")
            mine = actions.digest(found.statement)
            signed = args.members or (mine,)
            if mine not in signed:
                raise refused(Refused("group", "this host's action statement is not in the list the touch signs"))
            enrolled, count, digest = keys.verified(args.credential, actions.challenge(signed))
            credential_id = enrolled.credential_id
            if keys.role(enrolled.account) != "operator":
                raise no("not_operator", f"{enrolled.account!r} is not an operator: an observer's passkey only views")
            person = person_of(enrolled.account)
            if found.kill is not None:  # still running?  Journal a kill only of a job that is there to kill
                now = await self.killing.kill_dry(found.kill)
                if found.job is None or now.get("operation_id") != found.job.get("operation_id"):
                    raise AirlockError(ErrorCode.NOT_FOUND, "the job this statement names is no longer running")
        except AirlockError as exc:
            self.passkeys.passkey_refusals.refused(call.peer.uid)
            job = (found.job if found else None) or {}
            await self.passkeys.audit.record(
                "operator.action",
                Ids(job.get("request_id"), job.get("operation_id"), call.peer.uid),
                payload={
                    "action": "passkey.refused",
                    "via": "passkey",
                    "acting": found.action if found else None,
                    "code": exc.code.value,
                    "reason_code": exc.details.get("reason"),
                    "message": exc.message,
                    "credential_id": credential_id or exc.details.get("credential_id"),
                    "carrier": carrier,
                },
            )
            raise
        keys.spend(enrolled.credential_id, count, digest)
        extra = {
            "via": "passkey",
            "method": "passkey",
            "credential_id": enrolled.credential_id,
            "carrier": carrier,
            "statement": mine,  # this host's action statement, as signed
            "touch": {"hosts": len(signed), "digest": actions.challenge(signed).hex()},
        }
        by = {"user": person.user, "uid": person.uid, "credential_id": enrolled.credential_id}
        result: dict[str, Any]
        if found.action == "kill":
            assert found.kill is not None
            assert found.job is not None
            result = (await self.killing.kill_as(person, found.kill, found.job, extra)).to_dict()
        elif found.action == "hold":
            result = (await self.book.hold_as(person, found.reason, extra)).to_dict()
        else:
            result = (await self.book.release_as(person, extra)).to_dict()
        self.passkeys.log.info(
            "approval.passkey.acted", action=found.action, account=person.user, credential_id=enrolled.credential_id
        )
        return pk.Acted(found.action, by, result)
