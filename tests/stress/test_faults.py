"""Faults: services killed under load, the journal's disk full, the runner and approval unreachable.

Each request fails closed with one clean answer (or, when its own connection
dies with intake, a clean connection error) and never hangs; nothing runs
unaudited; nothing acknowledged is lost; the services come back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stress_support import (
    SERVICES,
    RequestMaker,
    Result,
    Stack,
    Tally,
    audit,
    expected,
    fill,
    kind_of,
    mount_tmpfs,
    run_load,
    running_stack,
    stress_clients,
    stress_n,
    verify_chain,
    well_formed,
)


def _healthy(stack: Stack, maker: RequestMaker, count: int = 12) -> list[Result]:
    """A batch after the fault: every answer is the one its kind gets on a healthy stack."""
    results = asyncio.run(run_load(stack.agent, [maker.make(kind_of(i)) for i in range(count)], 4, timeout=60))
    wrong = [(r.planned.kind, why) for r in results if (why := expected(r)) is not None]
    assert not wrong, wrong
    return results


def _no_hangs_and_well_formed(results: list[Result]) -> None:
    hangs = [r.planned.request_id for r in results if (r.connection_error or "").startswith("HANG")]
    assert not hangs, f"{len(hangs)} requests hung: {hangs[:5]}"
    bad = [r.reply for r in results if r.reply is not None and not well_formed(r.reply, r.planned.request_id)]
    assert not bad, bad[:3]


def test_sigkill_each_service_in_turn_under_load(tmp_path: Path, tally: Tally) -> None:
    n = max(200, stress_n() // 10)
    with running_stack(tmp_path / "k") as stack:
        maker = RequestMaker(tmp_path / "markers")
        planned = [maker.make(kind_of(i)) for i in range(n)]
        results: list[Result] = []

        async def main() -> list[str]:
            load = asyncio.create_task(run_load(stack.agent, planned, stress_clients(), timeout=90, results=results))
            killed = []
            loop = asyncio.get_running_loop()
            for step, name in enumerate(("journal", "approval", "runner", "intake"), start=1):
                # Spread the kills over the load: the k-th when k/5 of it is answered.
                while len(results) < n * step // 5 and not load.done():
                    await asyncio.sleep(0.02)
                if load.done():
                    break
                await loop.run_in_executor(None, stack.kill_service, name)
                killed.append(name)
            await load
            return killed

        killed = asyncio.run(main())
        after = _healthy(stack, maker)
        found = audit(stack, results + after, maker.markers)
        chain = verify_chain(stack)
        tally.add("sigkill each service", results, found)

    assert killed == ["journal", "approval", "runner", "intake"], f"the load ended before every kill: {killed}"
    assert len(results) == n
    _no_hangs_and_well_formed(results)
    assert found.lost == [] and found.unaudited == [], found
    assert chain.get("ok") is True, chain


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    runtime = tmp_path / "f"
    state = runtime / "state"
    why = mount_tmpfs(state, "2m")
    if why is not None:
        pytest.skip(why)
    try:
        yield runtime
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_journal_disk_full_fails_closed_and_recovers(small_state: Path, tmp_path: Path, tally: Tally) -> None:
    with running_stack(small_state) as stack:
        maker = RequestMaker(tmp_path / "markers")
        before = _healthy(stack, maker, 6)
        filler = fill(small_state / "state")
        results: list[Result] = []
        # SQLite may still fit a few commits into WAL pages it already has;
        # keep asking until the journal really has no room.
        for _ in range(200):
            batch = asyncio.run(run_load(stack.agent, [maker.make("marker") for _ in range(4)], 4, timeout=60))
            results += batch
            if sum(1 for r in batch if r.reply and not r.reply["ok"]) == len(batch):
                break
        full = [r for r in results if r.reply and not r.reply["ok"]]
        filler.unlink()
        # With room again, the journal works again (its writer reloads the head).
        deadline = time.monotonic() + 30
        while True:
            try:
                after = _healthy(stack, maker, 6)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        found = audit(stack, before + results + after, maker.markers)
        chain = verify_chain(stack)
        tally.add("journal disk full", results, found)

    assert full, "the journal never ran out of room"
    codes = {r.reply["error"]["code"] for r in full if r.reply}
    assert codes == {"audit_unavailable"}, codes
    ran = [r.planned.request_id for r in full if os.path.exists(maker.markers / r.planned.request_id)]
    started = [rid for rid in ran if rid not in found.unaudited]
    # A refused request may only have run if its exec.started was durable first.
    assert set(ran) == set(started), ran
    _no_hangs_and_well_formed(results)
    assert found.lost == [] and found.unaudited == [], found
    assert chain.get("ok") is True, chain


@pytest.mark.parametrize(("service", "code"), [("runner", "runner_unavailable"), ("approval", "approval_unavailable")])
def test_stopped_service_fails_closed_and_nothing_runs(tmp_path: Path, tally: Tally, service: str, code: str) -> None:
    # A stopped process keeps its socket open, so connections queue and
    # nobody answers: the worst case of "unreachable".  Short budgets: the
    # job's timeout bounds the runner's, approval.timeout_seconds approval's.
    with running_stack(tmp_path / "u", approval={"timeout_seconds": 1}) as stack:
        maker = RequestMaker(tmp_path / "markers")
        before = _healthy(stack, maker, 4)
        pid = stack.service_pid(service)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            results = asyncio.run(
                run_load(stack.agent, [maker.make("marker", timeout_ms=1000) for _ in range(4)], 4, timeout=90)
            )
            waited = time.monotonic() - started
            ran_while_stopped = sorted(os.listdir(maker.markers))
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(2)  # what was queued at the stopped service is now served (and must not run)
        after = _healthy(stack, maker, 4)
        found = audit(stack, before + results + after, maker.markers)
        chain = verify_chain(stack)
        tally.add(f"{service} stopped (SIGSTOP)", results, found)

    _no_hangs_and_well_formed(results)
    codes = [r.reply["error"]["code"] if r.reply and not r.reply["ok"] else "ok" for r in results]
    assert codes == [code] * len(results), codes
    assert waited < 60, waited
    late = {r.planned.request_id for r in results} & set(os.listdir(maker.markers))
    assert not late, f"refused requests ran after the service came back: {late}"
    assert [m for m in ran_while_stopped if m in {r.planned.request_id for r in results}] == []
    assert found.lost == [] and found.unaudited == [], found
    assert chain.get("ok") is True, chain


def test_every_service_is_back(tmp_path: Path) -> None:
    """After kills, each service is a new process and the stack answers (a smoke check of kill_service)."""
    with running_stack(tmp_path / "b") as stack:
        for name in SERVICES:
            old = stack.service_pid(name)
            assert stack.kill_service(name) != old
        assert stack.native("ping")["ok"] is True
        assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True
