"""A request waiting for approval, and what its ticket binds.

`Pending` is what approval holds for each request an operator (or a quorum) must
decide and what `pending`/`watch` show of it; `bind_binaries` and
`describe_binaries` are the binaries' identities a ticket binds and a reviewer
sees; `ticket_binding` is the one digest a ticket is issued for and the runner
must present at redeem.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airlock.approval import quorum
from airlock.approval.rules import Decision
from airlock.approval.signed import Published
from airlock.approval.statement import SIGN_COMMAND
from airlock.approval.transitions import Outcome, State
from airlock.common import binary, interp, shown
from airlock.common.codec import canonical_json
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.common.resolve import default_path, first_on_path
from airlock.common.wire.picking import EXPECT_HEX


@dataclass
class Pending:
    request_id: str
    operation_id: str | None
    peer: Peer
    request: dict[str, Any]
    decision: Decision
    digest: str
    bound: dict[str, Any]
    created: float
    expires: float
    rule: str = ""
    binaries: list[dict[str, Any]] = field(default_factory=list)
    # From the checked spec (exec or file), not the raw request: what the operator must see.
    privileged: bool = True
    run_as: int = 0
    run_as_user: str = ""
    # Issue 18: the approvals collected so far, and the statements a signer signs.
    tally: quorum.Tally | None = None
    published: Published | None = None
    # Issue 34: the reviewer's opinion (approval/reviewer.py), shown to operators.
    opinion: dict[str, Any] | None = None
    # Issue 34: an identical request of the same agent pending already (same uid, session, ticket
    # binding, rule): this one is attached to it and decided with it (its key), and says so.
    attached_to: tuple[int, str] | None = None
    decided_with: str = ""  # the request whose decision decided this one
    solo: bool = False  # decided for itself alone (an operator's cancel): its followers keep waiting
    # Issue 47: where it stands (approval/transitions.py) and how it ended.  Only `PendingTable` moves
    # them (table.py: settle, outcome); everyone else asks the table (`is_open`).
    state: State = State.PENDING
    ended: Outcome | None = None
    _waiter: asyncio.Future[Outcome] | None = field(default=None, init=False, repr=False, compare=False)
    # Issue 45: a command's whole stdin (base64), for operators' `show ID --stdin` only; views hold its digest.
    stdin: str | None = field(default=None, repr=False)

    @property
    def expect(self) -> str:
        """What approve lines carry as ``--expect`` (approval/refs.py): a short digest of this
        pending request's allow statement (its ticket binding and its fresh nonce)."""
        if self.published is None:
            return ""
        return expect_of(self.published.statements["allow"].to_bytes())

    def to_dict(self, now: float) -> dict[str, Any]:
        raw_spec = self.request.get("spec")
        spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
        return {
            "request_id": self.request_id,
            "operation_id": self.operation_id,
            "expect": self.expect,
            "peer": self.peer.to_dict(),
            "session": self.request.get("session") or "",
            "host": self.request.get("host") or "",
            "reason": self.request.get("reason") or "",
            "privileged": self.privileged,
            "run_as": {"uid": self.run_as, "user": self.run_as_user},
            "env_names": sorted([*(spec.get("env") or {}), *(spec.get("protected_names") or [])]),
            # Issue 45: where it runs and what it reads (stdin by size and sha256; its excerpt is in request).
            "cwd": shown.cwd_line(spec.get("cwd"), privileged=self.privileged) if "stages" in spec else None,
            "stdin": spec.get("stdin"),
            "stages": self.binaries,
            "binaries": list(self.bound.get("binaries") or []),
            "sandbox": list(self.bound.get("sandbox") or []),
            # Issue 27: path arguments someone other than root can change, as bound (flagged to people).
            "arguments": list(self.bound.get("arguments") or []),
            # Issue 35: the credentials each stage would receive, by name (never a value).
            "credentials": [sorted(stage) for stage in self.bound.get("credentials") or []],
            "rule": self.rule,
            "request": self.request,
            "policy": self.decision.to_dict(),
            "created": self.created,
            "expires": self.expires,
            "seconds_left": max(0.0, round(self.expires - now, 1)),
        } | self.quorum_dict()

    def approvers(self) -> dict[str, Any]:
        """Who approved, for approval.decided: each approver (uid, or principal and key fingerprint)."""
        if self.tally is None or not self.tally.votes:
            return {}
        return {"approvers": [v.to_dict() for v in self.tally.votes], "quorum": self.tally.progress()}

    def attachment(self) -> dict[str, Any]:
        """Issue 34: the request this one is attached to and decided with, if any."""
        return {"attached_to": self.attached_to[1]} if self.attached_to else {}

    def quorum_dict(self) -> dict[str, Any]:
        """Quorum progress ("1 of 2"), the reason rule, and the statement to sign (issue 18); the reviewer's opinion."""
        out: dict[str, Any] = {}
        if self.tally is not None:
            out["quorum"] = self.tally.to_dict()
        if self.published is not None:
            out["statement"] = self.published.statements["allow"].render()
            out["sign_command"] = SIGN_COMMAND
        if self.opinion:  # issue 34: what the reviewer said, for the people who decide
            out["reviewer"] = self.opinion
        return out


# EXPECT_HEX (12 hex digits, 48 bits): an agent cannot make two pending requests share one by trying.


def expect_of(statement: bytes) -> str:
    """The short digest an approve line carries (``--expect``): of a pending request's allow statement."""
    return hashlib.sha256(b"airlock expect v1\n" + statement).hexdigest()[:EXPECT_HEX]


def describe_binaries(
    decision: Decision, target_uid: int, identities: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Each stage's program as a reviewer must see it: the path found, where a symlink
    leads, and the identity of the file the ticket binds (the one that will run)."""
    out = []
    for index, stage in enumerate(decision.stages):
        name = stage.argv[0] if stage.argv else ""
        found = first_on_path(name, default_path(target_uid))
        item: dict[str, Any] = {
            "argv": list(stage.argv),
            "binary": found or stage.resolved,
            "resolved": stage.resolved,
            "symlink": found is not None and stage.resolved is not None and found != stage.resolved,
            "decision": stage.decision,
            "rule": stage.rule,
        }
        if identities is not None and index < len(identities):
            item["identity"] = identities[index]
        out.append(item)
    return out


def bind_binaries(decision: Decision, *, privileged: bool) -> list[dict[str, Any]]:
    """The identity of each stage's canonical binary, as the runner must find it (issue 14).

    Opened like the runner opens it (component by component, no symlink
    followed); a root job's binary must also be root's alone (``unsafe_binary``).
    """
    out = []
    for stage in decision.stages:
        if stage.resolved is None:  # the policy denies an unresolved stage; nothing to bind
            raise AirlockError(ErrorCode.SPAWN_FAILED, f"{stage.argv[0] if stage.argv else ''}: command not found")
        out.append(binary.bind(stage.resolved, privileged=privileged))
    return out


def check_chains(decision: Decision) -> None:
    """Refuse early a root job whose interpreter chain others can change, before an operator
    spends time on it (the runner checks every root job again, and alone for a rule's allow).

    Approval may not be able to read a root-only binary; then only the runner checks.
    """
    for stage in decision.stages:
        if stage.resolved is not None:
            _check_chain(stage.resolved)


def _check_chain(path: str) -> None:
    fd, _st = binary.open_binary(path, trusted=True)
    try:
        interp.check(path, fd)
    except OSError:  # unreadable here (a root-only binary): the runner, root, checks it
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Ticket:
    binding: str  # ticket_binding(digest, bound): what the runner must present to redeem
    expires: float
    by_policy: bool  # a rule's allow, not an operator's: the hold stops it until redeemed
    mark: str | None = None  # the deferred approval.decided's mark (issue 21), for the runner's exec.started


def ticket_binding(digest: str, bound: Mapping[str, Any]) -> str:
    """What a ticket is bound to: the spec's digest and what approval resolved for it.

    ``bound`` holds what approval saw beyond the request itself (the binaries'
    identities, a file's reviewed content hash); the runner presents the same
    object at redeem and then enforces it, so a compromised intake can change
    neither without the redeem failing.
    """
    return hashlib.sha256(canonical_json({"digest": digest, "bound": dict(bound)})).hexdigest()


# What names this host's own files rather than what they are: a binary's or a path argument's device and
# inode numbers (common/binary.py, runner/arguments.py).  Two hosts never share them.
PER_HOST_KEYS = frozenset({"dev", "ino"})


def _without_per_host(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_per_host(v) for k, v in value.items() if k not in PER_HOST_KEYS}
    if isinstance(value, list | tuple):
        return [_without_per_host(v) for v in value]
    return value


def fleet_binding(digest: str, bound: Mapping[str, Any]) -> str:
    """`ticket_binding` as any host would compute it for the same request (issue 49).

    The same request on two hosts has the same spec digest and binds the same paths, owners, modes,
    content hashes, sandbox and environment, but each host's binaries sit at its own device and inode
    numbers: those (`PER_HOST_KEYS`, at any depth) are left out here, everything else kept.  A group of
    hosts' requests is keyed on this (common/groups.py); each host's own ``binding``, inode and all,
    stays in its own statement, which the touch signs through the group's list of statement digests.
    """
    return hashlib.sha256(canonical_json({"digest": digest, "bound": _without_per_host(dict(bound))})).hexdigest()
