"""Issue 50: a ticket is spent once, however a compromised intake presents it.

A compromised intake holds every ticket approval issues (it carries them to the
runner).  It replays a rule's ticket after the job ran, and presents one ticket
twice at the same moment: exactly one job runs, the other is refused as
`invalid_ticket` and journaled as `exec.refused`.  The control: the same
ticket, presented once, runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.peer import identify
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire_approval
from airlock.common.wire.verb import Stub

from support import Stack


def _spec(script: str) -> ExecSpec:
    return ExecSpec(mode="exec", stages=(("/bin/sh", "-c", script),), privileged=False, uid=os.geteuid())


async def _decide(stack: Stack, spec: ExecSpec) -> tuple[str, dict[str, Any]]:
    """What intake gets from approval for an allowed request: the ticket and what it binds."""
    approval = Client(
        stack.runtime_dir / "internal" / "approval.sock", service="approval", unavailable=ErrorCode.APPROVAL_UNAVAILABLE
    )
    peer = identify(os.getpid(), os.geteuid(), os.getegid())
    decide = wire_approval.Decide.from_dict(
        {
            "request": {"request_id": str(uuid.uuid4())},
            "spec": spec.to_dict(),
            "peer": peer.to_dict(),
            "operation_id": str(uuid.uuid4()),
        }
    )
    decided = await Stub(wire_approval.DOOR, approval).call(wire_approval.DECIDE, decide)
    assert decided.ticket, decided  # the dev stack's rule allows it
    return decided.ticket, dict(decided.bound)


async def _present(stack: Stack, spec: ExecSpec, ticket: str, bound: dict[str, Any]) -> str:
    """The runner's exec, as intake sends it (each presentation its own operation ID)."""
    runner = Client(
        stack.runtime_dir / "internal" / "runner.sock", service="runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE
    )
    args = {"ticket": ticket, "spec": spec.to_dict(), "operation_id": str(uuid.uuid4()), "bound": bound}
    try:
        await runner.call("exec", args)
    except AirlockError as exc:
        return exc.code.value
    return "ran"


def _runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def _refusals(stack: Stack) -> list[str]:
    return [json.loads(r["payload"])["code"] for r in stack.journal_rows() if r["kind"] == "exec.refused"]


def test_a_ticket_presented_once_runs(stack: Stack, tmp_path: Path) -> None:
    """The control: the setup below runs the job when nobody replays anything."""
    marker = tmp_path / "runs"
    spec = _spec(f"echo ran >> {marker}")

    async def scenario() -> str:
        ticket, bound = await _decide(stack, spec)
        return await _present(stack, spec, ticket, bound)

    assert asyncio.run(scenario()) == "ran"
    assert _runs(marker) == 1


def test_a_spent_ticket_replayed_runs_nothing(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    spec = _spec(f"echo ran >> {marker}")
    refused_before = _refusals(stack).count("invalid_ticket")

    async def scenario() -> list[str]:
        ticket, bound = await _decide(stack, spec)
        return [await _present(stack, spec, ticket, bound), await _present(stack, spec, ticket, bound)]

    assert asyncio.run(scenario()) == ["ran", "invalid_ticket"]
    assert _runs(marker) == 1
    assert _refusals(stack).count("invalid_ticket") == refused_before + 1  # the attempt is journaled


def test_one_ticket_presented_twice_at_once_runs_once(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    spec = _spec(f"echo ran >> {marker}")

    async def scenario() -> list[str]:
        ticket, bound = await _decide(stack, spec)
        return list(await asyncio.gather(*(_present(stack, spec, ticket, bound) for _ in range(4))))

    outcomes = asyncio.run(scenario())
    assert sorted(outcomes) == ["invalid_ticket"] * 3 + ["ran"], outcomes
    assert _runs(marker) == 1
