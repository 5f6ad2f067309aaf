"""One way to start a child process (mkosi's ``run.py``): its environment, its stop, its exit.

- **Environment**: rebuilt from nothing by `environment` — ``PATH`` (root's,
  Debian's ENV_SUPATH, unless the caller names another) and ``LANG=C.UTF-8``,
  plus exactly what the caller adds.  Nothing is inherited, so no
  ``LISTEN_*``, ``NOTIFY_SOCKET`` or other variable of the parent reaches a child.
- **Stop**: `terminate` is the one timeout-then-kill policy — SIGTERM to
  everything the child is, up to ``grace`` seconds, SIGKILL, and the exit is
  always waited for.  `run` (a helper command: ``busctl``, the notify hook)
  applies it when its deadline passes; the runner applies it to a job through
  its containment; `stop_all` applies it to `airlock dev up`'s services.
- **Exit**: `describe_exit` turns a return code into ``(exit_code, signal)``;
  `exit_text` says the same in words for messages and logs.

A helper started by `run` gets stdin from ``/dev/null`` or the given bytes, ``/``
as its directory, no inherited descriptors and its own process group (so a
stop reaches what it started too).  The runner's jobs are started by
``runner/spawn.py`` (they need a held binary, an identity and a containment),
which takes the policy and the exit description from here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airlock.common.resolve import ROOT_PATH

if TYPE_CHECKING:
    import asyncio
# asyncio is imported by the coroutines below, not here: `airlock dev up` takes only `environment` and
# `stop_all`, and ~15 ms of asyncio before it starts the services is 15 ms on every service's start (issue 50).

LANG = "C.UTF-8"
# How long a helper command has between SIGTERM and SIGKILL once its deadline passed.
HELPER_GRACE_SECONDS = 1.0


def environment(path: str = ROOT_PATH, **extra: str) -> dict[str, str]:
    """A child's whole environment: PATH, LANG and what the caller names; nothing inherited."""
    return {"PATH": path, "LANG": LANG, **extra}


def describe_exit(returncode: int) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` from a subprocess return code (negative: killed by a signal)."""
    if returncode < 0:
        return None, -returncode
    return returncode, None


def exit_text(returncode: int) -> str:
    """A return code in words: ``exit status 3``, ``killed by SIGKILL``, ``exit status 127 (command not found)``."""
    code, signum = describe_exit(returncode)
    if signum is not None:
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            return f"killed by signal {signum}"
    if code == 127:
        return "exit status 127 (command not found)"
    if code == 126:
        return "exit status 126 (not executable)"
    return f"exit status {code}"


async def terminate(send: Callable[[int], Awaitable[None]], exited: asyncio.Future[None], grace: float) -> None:
    """The one stop: ``send(SIGTERM)``, up to ``grace`` seconds, ``send(SIGKILL)``, then wait for ``exited``."""
    import asyncio

    await send(signal.SIGTERM)
    if grace > 0:
        await asyncio.wait({exited}, timeout=grace)
    if not exited.done():
        await send(signal.SIGKILL)
    await exited


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


@dataclass(frozen=True, slots=True)
class Finished:
    """How a helper command ended: its return code, its output, and whether its deadline passed."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool

    @property
    def exit_code(self) -> int | None:
        return describe_exit(self.returncode)[0]

    @property
    def signal(self) -> int | None:
        return describe_exit(self.returncode)[1]

    def text(self) -> str:
        return exit_text(self.returncode)


async def run(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    timeout: float,  # noqa: ASYNC109  the helper's deadline: passing it stops the process, not just this await
    stdin: bytes | None = None,
    capture_stdout: bool = True,
    grace: float = HELPER_GRACE_SECONDS,
    pass_fds: Sequence[int] = (),
) -> Finished:
    """Run a helper command to its end, within ``timeout`` (then `terminate`, with ``grace``).

    Raises OSError when it cannot be started.  Cancelled, the command is killed
    and waited for before the cancellation goes on.  Output is captured in
    memory: helpers say little (callers cap what they log).  ``pass_fds``: the
    only descriptors the helper inherits (e.g. a sealed memfd it reads as
    ``/proc/self/fd/N``).
    """
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE if capture_stdout else asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd="/",
        close_fds=True,
        pass_fds=tuple(pass_fds),
        start_new_session=True,  # its own process group: a stop reaches what it started
    )

    async def send(signum: int) -> None:
        _signal_group(proc.pid, signum)

    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        await terminate(send, _exited(proc), grace)
        return Finished(_returncode(proc), b"", b"", True)
    except asyncio.CancelledError:
        _signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    return Finished(_returncode(proc), stdout or b"", stderr or b"", False)


def _exited(proc: asyncio.subprocess.Process) -> asyncio.Future[None]:
    import asyncio

    async def wait() -> None:
        await proc.wait()

    return asyncio.ensure_future(wait())


def _returncode(proc: asyncio.subprocess.Process) -> int:
    # Waited for by now, so set; were it not, it did not exit on its own.
    return proc.returncode if proc.returncode is not None else -signal.SIGKILL


def stop_all(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """`terminate` for long-running children of a synchronous parent (`airlock dev up`'s services).

    SIGTERM to each, up to ``grace`` seconds for all of them, SIGKILL to those
    still running; every one is waited for.
    """
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
