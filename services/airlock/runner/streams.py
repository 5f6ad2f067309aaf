"""A job's pipe ends and output streams: fds owned by the job and closable
exactly once, stages waited for by pidfd, output redacted, capped and
delivered, stdin fed without blocking the event loop.

Two caps hold while the pipes are read, never after: each stream's own
(``max_output_bytes``) and one `OutputBudget` shared by every stream of the
job (``limits.max_total_output_bytes``), so a 64-stage pipeline keeps no more
than one request's worth of output in the root runner.  Past either, the
bytes are read and dropped (the job never blocks on a full pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import subprocess
from collections.abc import Callable

import structlog

from airlock.runner.evidence import sha256_hex
from airlock.runner.jobspec import JobSpec
from airlock.runner.outputlog import OutputLog
from airlock.runner.redact import Capture, StreamRedactor

OutputCallback = Callable[[str, int, bytes], None]

_READ_SIZE = 256 * 1024
_PIPE_SIZE = 1024 * 1024  # fewer wake-ups while draining a fast producer
_WRITE_SIZE = 64 * 1024


# --- file descriptors owned by one job ------------------------------------------


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Fd:
    """One pipe end the job owns, closable from anywhere, exactly once.

    A task waiting on it may be cancelled after the job closed it; it then
    must not unregister a later, unrelated user of the same fd number.
    """

    __slots__ = ("fd", "watched")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.watched = False  # ever registered with the event loop

    async def wait(self, *, write: bool) -> None:
        loop = asyncio.get_running_loop()
        self.watched = True
        future: asyncio.Future[None] = loop.create_future()
        fd = self.fd
        if write:
            loop.add_writer(fd, _wake, future)
        else:
            loop.add_reader(fd, _wake, future)
        try:
            await future
        finally:
            if self.fd == fd and write:  # still ours
                loop.remove_writer(fd)
            elif self.fd == fd:
                loop.remove_reader(fd)

    def close(self) -> None:
        if self.fd < 0:
            return
        if self.watched:  # only then is there a loop to tell (spawning runs in a thread)
            loop = asyncio.get_running_loop()
            loop.remove_reader(self.fd)
            loop.remove_writer(self.fd)
        os.close(self.fd)
        self.fd = -1


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait for a stage to exit and reap it, without a thread (pidfd)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # a kernel before 5.3
        return await asyncio.to_thread(proc.wait)
    holder = _Fd(pidfd)
    try:
        while proc.poll() is None:
            await holder.wait(write=False)
    finally:
        holder.close()
    assert proc.returncode is not None
    return proc.returncode


# --- output streams --------------------------------------------------------------


class OutputBudget:
    """The bytes all of one job's streams may still keep together (None: no shared cap)."""

    __slots__ = ("left", "total", "truncated")

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.left = total
        self.truncated = False  # some stream lost bytes to this budget

    def room(self, wanted: int) -> int:
        return wanted if self.left is None else min(wanted, self.left)

    def spend(self, used: int) -> None:
        if self.left is not None:
            self.left -= used


class _Stream:
    """One captured stream: redact, then cap, then deliver."""

    __slots__ = ("_budget", "_callback", "_capture", "_log", "_redactor", "name", "stage")

    def __init__(
        self,
        name: str,
        stage: int,
        spec: JobSpec,
        on_output: OutputCallback | None,
        budget: OutputBudget | None = None,
        log: OutputLog | None = None,
    ) -> None:
        self.name = name
        self.stage = stage
        self._callback = on_output
        self._log = log  # the runner's output log (outputlog.py): the same delivered bytes
        self._budget = budget or OutputBudget(None)
        self._redactor = StreamRedactor(spec.protected_values)
        wanted = on_output is not None or log is not None
        self._capture = Capture(spec.max_output_bytes, self._deliver if wanted else None)

    def _deliver(self, data: bytes) -> None:
        if self._log is not None:
            self._log.add(self.name, self.stage, data)
        if self._callback is None:
            return
        try:
            self._callback(self.name, self.stage, data)
        except Exception as exc:
            # A broken listener (say, a client that went away) must not stop the
            # draining that keeps the job from blocking; the evidence is complete.
            structlog.get_logger().warning("runner.output.listener_failed", stream=self.name, error=type(exc).__name__)
            self._callback = None

    def feed(self, data: bytes) -> None:
        if not self._capture.truncated:  # past the cap the bytes are only drained
            self._add(self._redactor.feed(data))

    def _add(self, data: bytes) -> None:
        """Keep what both caps allow: this stream's own and the job's shared budget."""
        if not data:
            return
        room = self._budget.room(len(data))
        before = self._capture.held
        self._capture.add(data, room)
        self._budget.spend(self._capture.held - before)
        if room < len(data) and self._capture.truncated:
            self._budget.truncated = True

    def finish(self) -> tuple[bytes, bool, str]:
        self._add(self._redactor.flush())
        data = self._capture.finish()
        return data, self._capture.truncated, sha256_hex(data)


async def _pump(fd: _Fd, stream: _Stream) -> None:
    while fd.fd >= 0:
        try:
            data = os.read(fd.fd, _READ_SIZE)
        except BlockingIOError:
            await fd.wait(write=False)
            continue
        if not data:
            break
        stream.feed(data)
    fd.close()


async def _feed(fd: _Fd, data: bytes) -> None:
    """Write all of ``data`` without blocking the loop, then close (EOF for the reader)."""
    view = memoryview(data)
    try:
        while view and fd.fd >= 0:
            try:
                written = os.write(fd.fd, view[:_WRITE_SIZE])
            except BlockingIOError:
                await fd.wait(write=True)
                continue
            view = view[written:]
    except BrokenPipeError:
        pass  # the reader is gone (a stage that does not read stdin); its business
    finally:
        fd.close()


def _grow_pipe(fd: int) -> None:
    with contextlib.suppress(OSError):  # the per-user pipe quota may say no
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
