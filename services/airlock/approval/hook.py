"""`approval.notify_command`: tell a human that a request is waiting.

The command runs as the approval service's own user, started the one way
(`airlock.common.child`): a rebuilt environment (PATH, LANG and two AIRLOCK_*
variables, nothing inherited), the pending request as JSON on stdin, and a
deadline, after which it is stopped (SIGTERM, a second, SIGKILL).  Its output and exit are
logged as structured events.  A hook that fails, hangs or is missing is
logged and forgotten: it never blocks or changes a decision.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from airlock.common import child, log

MAX_LOGGED_OUTPUT = 4096
# A flood of pending requests must not become a flood of processes.
MAX_RUNNING = 16


class NotifyCommand:
    """`approval.notify_command`, started for each newly pending request (not sd_notify: that is
    `common.notify.Notifier`)."""

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
        env = child.environment(AIRLOCK_REQUEST_ID=str(request_id), AIRLOCK_OPERATOR_SOCKET=self.operator_socket)
        body = json.dumps(request, ensure_ascii=False).encode() + b"\n"
        try:
            done = await child.run(self.argv, env=env, stdin=body, timeout=self.timeout)
        except OSError as exc:
            self.log.warning("approval.notify.failed", request_id=request_id, command=self.argv[0], error=str(exc))
            return
        fields = {
            "request_id": request_id,
            "command": self.argv[0],
            "exit_code": done.returncode,
            "exit": done.text(),
            "stdout": done.stdout[:MAX_LOGGED_OUTPUT].decode("utf-8", "replace"),
            "stderr": done.stderr[:MAX_LOGGED_OUTPUT].decode("utf-8", "replace"),
        }
        if done.timed_out:
            self.log.warning("approval.notify.timed_out", timeout_seconds=self.timeout, **fields)
        elif done.returncode != 0:
            self.log.warning("approval.notify.failed", **fields)
        else:
            self.log.info("approval.notify.finished", **fields)
