"""`approval.notify_command`: tell a human that a request is waiting.

The command runs as the approval service's own user with a rebuilt
environment (PATH, LANG and two AIRLOCK_* variables, nothing inherited), the
pending request as JSON on stdin, and a deadline.  Its output and exit are
logged as structured events.  A hook that fails, hangs or is missing is
logged and forgotten: it never blocks or changes a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any

from airlock.common import log

HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_LOGGED_OUTPUT = 4096
# A flood of pending requests must not become a flood of processes.
MAX_RUNNING = 16


class Notifier:
    def __init__(self, argv: tuple[str, ...], timeout: float, operator_socket: str) -> None:
        self.argv = argv
        self.timeout = timeout
        self.operator_socket = operator_socket
        self._tasks: set[asyncio.Task[None]] = set()
        self.log = log.get()

    def pending(self, request: dict[str, Any]) -> None:
        """Start the hook for a newly pending request; returns at once."""
        if not self.argv:
            return
        if len(self._tasks) >= MAX_RUNNING:
            self.log.warning("approval.notify.skipped", request_id=request.get("request_id"), running=len(self._tasks))
            return
        task = asyncio.create_task(self._run(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2)

    async def _run(self, request: dict[str, Any]) -> None:
        request_id = request.get("request_id")
        env = {
            "PATH": HOOK_PATH,
            "LANG": "C.UTF-8",
            "AIRLOCK_REQUEST_ID": str(request_id),
            "AIRLOCK_OPERATOR_SOCKET": self.operator_socket,
        }
        body = json.dumps(request, ensure_ascii=False).encode() + b"\n"
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd="/",
                start_new_session=True,  # its own process group: a timeout kills the whole hook
            )
        except OSError as exc:
            self.log.warning("approval.notify.failed", request_id=request_id, command=self.argv[0], error=str(exc))
            return
        timed_out = False
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(body), self.timeout)
        except TimeoutError:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            stdout = stderr = b""
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        fields = {
            "request_id": request_id,
            "command": self.argv[0],
            "exit_code": proc.returncode,
            "stdout": stdout[:MAX_LOGGED_OUTPUT].decode("utf-8", "replace"),
            "stderr": stderr[:MAX_LOGGED_OUTPUT].decode("utf-8", "replace"),
        }
        if timed_out:
            self.log.warning("approval.notify.timed_out", timeout_seconds=self.timeout, **fields)
        elif proc.returncode != 0:
            self.log.warning("approval.notify.failed", **fields)
        else:
            self.log.info("approval.notify.finished", **fields)
