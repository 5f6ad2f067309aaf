"""Every wait the tests share: a condition polled until it holds, never past its bound.

A test waits for something a user would see -- a request pending for an
operator, a record in the journal, a service's new pid, text on a terminal --
never for a fixed time.  `until` is the one loop: it returns the first truthy
value the probe gives and fails with what never happened when the deadline
passes.  The named waits below are the ones several files need; a test with
a wait of its own writes it as ``until(what, probe)``.

A module of its own, not conftest.py, so test files import it by name (as
support.py).  Async tests call these through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # support.py re-exports wait_pending: import it only for types here
    from support import Stack

T = TypeVar("T")

TIMEOUT = 15.0  # the usual bound: far above what any of these takes on a loaded machine
INTERVAL = 0.05  # how often a condition is looked at


def _looked(what: str, probe: Callable[[], T | None], deadline: float, timeout: float) -> T | None:
    """One look: the probe's truthy value, None to look again, AssertionError once past ``deadline``."""
    value = probe()
    if value:
        return value
    if time.monotonic() >= deadline:
        raise AssertionError(f"{what}: not within {timeout:g}s")
    return None


def until(what: str, probe: Callable[[], T | None], timeout: float = TIMEOUT, interval: float = INTERVAL) -> T:
    """The first truthy value ``probe()`` returns; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (value := _looked(what, probe, deadline, timeout)) is None:
        time.sleep(interval)
    return value


async def until_async(
    what: str, probe: Callable[[], T | None], timeout: float = TIMEOUT, interval: float = INTERVAL
) -> T:
    """`until` inside an event loop, for a condition the loop itself brings about (a callback's state)."""
    deadline = time.monotonic() + timeout
    while (value := _looked(what, probe, deadline, timeout)) is None:
        await asyncio.sleep(interval)
    return value


# --- an operator's view: what is pending ----------------------------------------------


def pending(stack: Stack) -> list[dict[str, Any]]:
    """The requests pending now, as the operator door lists them."""
    listed: list[dict[str, Any]] = stack.native("pending", path=stack.operator)["data"]["pending"]
    return listed


def wait_pending(stack: Stack, request_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The pending entry of ``request_id``, once the operator can see it."""

    def find() -> dict[str, Any] | None:
        return next((p for p in pending(stack) if p["request_id"] == request_id), None)

    return until(f"{request_id} pending for an operator", find, timeout)


def wait_pending_with(stack: Stack, needle: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The pending entry whose request (as JSON) contains ``needle``: for callers that never see the ID."""

    def find() -> dict[str, Any] | None:
        return next((p for p in pending(stack) if needle in json.dumps(p["request"])), None)

    return until(f"a pending request with {needle!r}", find, timeout)


def wait_not_pending(stack: Stack, request_id: str, timeout: float = TIMEOUT) -> None:
    """Until ``request_id`` is no longer pending (decided, withdrawn, failed)."""
    until(
        f"{request_id} no longer pending", lambda: all(p["request_id"] != request_id for p in pending(stack)), timeout
    )


# --- the journal: what happened ------------------------------------------------------


def wait_record(
    stack: Stack,
    kind: str,
    *,
    request_id: str | None = None,
    operation_id: str | None = None,
    containing: str | None = None,
    count: int = 1,
    timeout: float = TIMEOUT,
) -> list[dict[str, Any]]:
    """The journal's records of ``kind`` (of ``request_id``, of ``operation_id``; whose payload contains
    ``containing``), once there are ``count`` of them."""

    def found() -> list[dict[str, Any]] | None:
        rows = [
            r
            for r in stack.journal_rows()
            if r["kind"] == kind
            and (request_id is None or r["request_id"] == request_id)
            and (operation_id is None or r["operation_id"] == operation_id)
            and (containing is None or containing in (r["payload"] or ""))
        ]
        return rows if len(rows) >= count else None

    which = f"request {request_id}, operation {operation_id}, containing {containing!r}"
    return until(f"{count} x {kind} in the journal ({which})", found, timeout)


def wait_log_events(log_dir: Path, event: str, count: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
    """The structured log lines named ``event`` in ``log_dir/*.log`` (dev up's logs), once there are ``count``."""

    def found() -> list[dict[str, Any]] | None:
        out = []
        for path in sorted(log_dir.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("event") == event:
                    out.append(entry)
        return out if len(out) >= count else None

    return until(f"{count} x {event} in {log_dir}", found, timeout)


# --- processes -----------------------------------------------------------------------


def wait_service_replaced(stack: Stack, name: str, old_pid: int, timeout: float = 30) -> int:
    """The pid of ``name`` once `dev up` runs another instance than ``old_pid``."""

    def new() -> int | None:
        pid = stack.find_service_pid(name)
        return pid if pid not in (None, old_pid) else None

    return until(f"{name} started again (was pid {old_pid})", new, timeout)


def wait_service_exited(stack: Stack, name: str, old_pid: int, timeout: float = 60) -> None:
    """Until pid ``old_pid`` is no longer ``name``'s (it exited; another may run already)."""
    until(f"{name} (pid {old_pid}) exited", lambda: stack.find_service_pid(name) != old_pid, timeout)


def processes_with(argv: Iterable[str]) -> list[int]:
    """The pids whose command line is exactly ``argv``."""
    wanted = b"\0".join(a.encode() for a in argv) + b"\0"
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if f.read() == wanted:
                        pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def wait_process(argv: Iterable[str], timeout: float = 20) -> list[int]:
    """The pids running exactly ``argv``, once there is one."""
    argv = list(argv)
    return until(f"a process running {argv}", lambda: processes_with(argv), timeout)


# --- terminals -------------------------------------------------------------------------


def wait_screen(capture: Callable[[], str], *texts: str, timeout: float = TIMEOUT, interval: float = 0.1) -> str:
    """The screen ``capture()`` returns once it shows every one of ``texts`` (a tmux pane, say)."""
    seen = [""]

    def shows() -> str | None:
        seen[0] = capture()
        return seen[0] if all(t in seen[0] for t in texts) else None

    try:
        return until(f"{texts!r} on the screen", shows, timeout, interval)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen shows:\n{seen[0]}") from None
