"""What the runner checks again because it trusts neither intake nor approval: each check by name.

Intake validated the request and approval decided on it; the runner is root
and runs it.  The message's own decode (`wire.runner.Exec.from_dict`: the
spec by `ExecSpec.from_dict`) checks shapes; what decides *what runs* is
checked again here, once, each check named for what it refuses:

- `environment`: every variable the job gets (the spec's and the protected
  ones) is in ``env.allow`` and is never ``SSH_AUTH_SOCK``; the protected
  names are the approved spec's.
- `output_ceiling`: the spec's output cap is within ``limits.max_output_bytes``.
- `redeem`: the ticket, single use, bound to the digest the runner computed
  itself and to ``bound`` as approval made it (approval's own check).
- `Redeemed`: what approval bound, parsed once, after redeem: each stage's
  binary, sandbox (typed, its unit properties computed once) and a root job's
  path arguments.
- `requester`: ``forward_agent``'s process belongs to the spec's uid.
- ``check_privilege``, `resolve_identity`, `check_cwd`: the runner's own
  uid may run the job as that user, in that directory.
- ``credentials.not_the_requester`` (runner/credentials.py, with the
  credentials it guards): a job given credentials runs as an account other
  than the requester's.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any

from airlock.common import binary, sandbox, validate
from airlock.common.arguments import parse_bound as argparse_bound
from airlock.common.config import Config
from airlock.common.containment import Containment
from airlock.common.ipc import Client
from airlock.common.spec import ExecSpec, check_privilege
from airlock.common.wire import approval as approval_wire
from airlock.common.wire import runner as wire
from airlock.common.wire.verb import Stub
from airlock.runner import agent
from airlock.runner.identity import build_env, check_cwd, default_cwd, resolve_identity
from airlock.runner.jobspec import JobSpec


def environment(spec: ExecSpec, protected: dict[str, str], allow: tuple[str, ...]) -> None:
    """The job's variables are the allowlist's (the rules intake applied, checked again here)."""
    for name in [*spec.env, *protected]:
        if name == agent.NAME or not validate.env_allowed(name, allow):
            raise validate.bad(f"env.{name}", "is not in the environment allowlist")
    if sorted(protected) != sorted(spec.protected_names):
        raise validate.bad("protected_env", "names do not match the approved request")


def output_ceiling(spec: ExecSpec, ceiling: int) -> None:
    validate.integer("max_output_bytes", spec.max_output_bytes, minimum=1, maximum=ceiling)


async def redeem(approval: Client, ticket: str, digest: str, bound: dict[str, Any]) -> str | None:
    """Spend the ticket (approval refuses another digest or another ``bound``); approval's deferred mark."""
    redeem = approval_wire.Redeem(ticket, digest, dict(bound))
    return (await Stub(approval_wire.DOOR, approval).call(approval_wire.REDEEM, redeem)).mark


@dataclass(frozen=True, slots=True)
class Redeemed:
    """What approval resolved and bound to the ticket, parsed once redeem vouched for it."""

    binaries: tuple[Any, ...]  # each stage's file to run (checked again when opened)
    sandboxes: tuple[sandbox.Sandbox, ...] | None  # each stage's rule's sandbox
    arguments: tuple[Any, ...] | None  # a root job's changeable path arguments (checked again at start)

    @classmethod
    def of(cls, bound: dict[str, Any], spec: ExecSpec) -> Redeemed:
        arguments = argparse_bound(bound.get("arguments"), spec.stages)
        if arguments and not spec.privileged:
            raise validate.bad("bound.arguments", "are bound for root jobs only")
        return cls(
            binaries=tuple(binary.parse_bound(bound.get("binaries"), len(spec.stages))),
            sandboxes=sandbox.parse_bound(bound.get("sandbox"), len(spec.stages)),
            arguments=tuple(arguments) or None,
        )


def requester(peer: wire.Requester | None, uid: int) -> tuple[int, int]:
    """The requesting process (pid, uid) as intake identified it; it must be the spec's uid."""
    if peer is None:
        raise validate.bad("peer", "the requesting process is needed for forward_agent")
    if peer.uid != uid:
        raise validate.bad("peer.uid", "is not the uid of the approved request")
    return peer.pid, peer.uid


@dataclass(frozen=True, slots=True)
class Prepared:
    job: JobSpec
    added: list[str]  # variables the runner set (journaled by name only)
    decided: str | None  # approval's deferred approval.decided, as redeem named it


async def prepare(config: Config, approval: Client, args: wire.Exec, digest: str, containment: Containment) -> Prepared:
    """Re-check the request, redeem its ticket, and build the job; raises if it must not run."""
    spec = args.spec
    environment(spec, args.protected_env, config.env.allow)
    ceiling = config.limits.max_output_bytes
    output_ceiling(spec, ceiling)
    decided = await redeem(approval, args.ticket, digest, args.bound)
    bound = Redeemed.of(args.bound, spec)

    check_privilege(spec.run_as, os.geteuid(), privileged=spec.privileged)
    identity = resolve_identity(spec.run_as)
    cwd = spec.cwd or default_cwd(identity)
    check_cwd(identity, cwd)

    env = build_env(identity, spec.env, args.protected_env, strict=spec.run_as == 0 or spec.privileged)
    # Set after the allowlist check above, which refuses SSH_AUTH_SOCK from the request.
    added: list[str] = []
    if spec.forward_agent:
        pid, peer_uid = requester(args.peer, spec.uid)
        forwarded = agent.agent_socket(pid, peer_uid, identity)
        if forwarded is not None:
            env[agent.NAME] = forwarded
            added.append(agent.NAME)
    limits = config.limits
    job = JobSpec(
        operation_id=args.operation_id,
        mode="shell" if spec.mode == "shell" else "exec",
        stages=spec.stages,
        identity=identity,
        env=env,
        cwd=cwd,
        stdin=base64.b64decode(spec.stdin) if spec.stdin else None,
        timeout_seconds=spec.timeout_ms / 1000 if spec.timeout_ms is not None else limits.default_timeout_seconds,
        # 0 is an absolute time (the epoch, long past), not "no deadline".
        deadline=spec.deadline_ms / 1000 if spec.deadline_ms is not None else None,
        max_output_bytes=spec.max_output_bytes or ceiling,
        max_total_output_bytes=limits.max_total_output_bytes,
        kill_grace_seconds=limits.kill_grace_seconds,
        protected_values=tuple(v for v in args.protected_env.values() if v),
        containment=containment,
        slice=config.runner.slice,
        memory_max=config.runner.memory_max,
        tasks_max=config.runner.tasks_max,
        cpu_quota=config.runner.cpu_quota,
        binaries=bound.binaries,
        owner_uid=spec.uid,
        privileged=spec.privileged,
        sandboxes=bound.sandboxes,
        arguments=bound.arguments,
    )
    return Prepared(job, added, decided)
