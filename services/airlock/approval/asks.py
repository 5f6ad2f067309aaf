"""Bounds on asking operators (issue 28): how many of an agent's requests wait at once, how many it asks a minute.

`AskLimits` is approval's one table of them (per agent uid); an `Admission`
is one ask counted until it is pending or gone.  Pure: no I/O (bookkeeping
only); the caller journals nothing for a refused ask.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from airlock.common.config import Approval as Limits
from airlock.common.errors import AirlockError, ErrorCode

ASK_WINDOW_SECONDS = 60.0


class AskLimits:
    """Per-uid bounds on asking an operator (issue 28): how many wait at once, how many a minute.

    Checked before anything is journaled or shown, so a refused ask costs an
    operator nothing: no ``approval.pending``, no relay message.  One agent
    asking and withdrawing in a loop is held to ``approval.asks_per_minute``
    and cannot push other agents' requests out of operators' sight.
    """

    def __init__(self) -> None:
        self.windows: dict[int, collections.deque[float]] = {}
        self.admitting: collections.Counter[int] = collections.Counter()  # admitted, not yet in pending
        self.refused: collections.Counter[int] = collections.Counter()  # refusals not yet logged
        self.logged: dict[int, float] = {}

    def admit(self, uid: int, waiting: int, max_pending: int, per_minute: int, now: float) -> None:
        """Count one ask of ``uid`` (``waiting`` of whose requests are pending now), or raise rate_limited."""
        window = self.windows.setdefault(uid, collections.deque())
        while window and window[0] <= now - ASK_WINDOW_SECONDS:
            window.popleft()
        if len(self.windows) > 4096:  # forget agents that have not asked for a minute
            for other in [u for u, w in self.windows.items() if not w or w[-1] <= now - ASK_WINDOW_SECONDS]:
                if other != uid:
                    del self.windows[other]
        waiting += self.admitting[uid]
        if waiting >= max_pending:
            raise AirlockError(
                ErrorCode.RATE_LIMITED,
                f"{waiting} of your requests already wait for an operator (approval.max_pending_per_agent is "
                f"{max_pending}); wait for their decisions or withdraw one",
                {"limit": "approval.max_pending_per_agent", "waiting": waiting, "max": max_pending},
            )
        if len(window) >= per_minute:
            retry = max(0.1, round(window[0] + ASK_WINDOW_SECONDS - now, 1))
            raise AirlockError(
                ErrorCode.RATE_LIMITED,
                f"you asked operators {len(window)} times in the last minute (approval.asks_per_minute is "
                f"{per_minute}); retry in {retry:g}s",
                {"limit": "approval.asks_per_minute", "max": per_minute, "retry_after_seconds": retry},
            )
        window.append(now)
        self.admitting[uid] += 1

    def settled(self, uid: int) -> None:
        """An admitted ask is in ``pending`` now, or never will be (call once per admit)."""
        self.admitting[uid] -= 1
        if self.admitting[uid] <= 0:
            del self.admitting[uid]

    def should_log(self, uid: int, now: float) -> int:
        """How many refusals to report now (0: not yet); at most one log line per agent a minute."""
        self.refused[uid] += 1
        if now - self.logged.get(uid, 0.0) < ASK_WINDOW_SECONDS:
            return 0
        self.logged[uid] = now
        return self.refused.pop(uid)

    def admission(self, uid: int, waiting: int, limits: Limits, log: Any, *, request_id: str | None) -> Admission:
        """Admit one ask of ``uid`` (``waiting`` of whose requests are pending) under ``limits``
        (``approval.*``), or raise rate_limited; a refusal is logged at most once a minute per agent."""
        now = time.time()
        try:
            self.admit(uid, waiting, limits.max_pending_per_agent, limits.asks_per_minute, now)
        except AirlockError as exc:
            count = self.should_log(uid, now)
            if count:
                log.warning(
                    "approval.ask.limited",
                    request_id=request_id,
                    peer_uid=uid,
                    limit=exc.details.get("limit"),
                    refused=count,
                    error=exc.message,
                )
            raise
        return Admission(self, uid)


class Admission:
    """One admitted ask: counted against its agent until it is in ``pending`` or gone (`release`, idempotent)."""

    def __init__(self, limits: AskLimits, uid: int) -> None:
        self.limits, self.uid, self.open = limits, uid, True

    def release(self) -> None:
        if self.open:
            self.open = False
            self.limits.settled(self.uid)
