"""Each agent's share of the audit journal's bytes (issue 39), without I/O.

One agent must not be able to fill the disk the journal lives on (then airlock
fails closed for everyone).  Every record the journal takes is charged to the
agent it is about (its ``peer_uid``) in a token bucket: ``burst`` bytes, refilled
at ``rate`` bytes per second.  The bucket is checked in one place only, when a
new request asks to begin (``op.begin``, before its first record): an agent in
debt is refused with ``rate_limited`` and nothing of that request is written.
A request already admitted is never cut short -- its later records (decision,
start, end, reply) are charged and may take the bucket below zero -- so no
request's story is ever half-written; the debt is paid back before the agent's
next request is admitted.  Memory: one small entry per agent uid seen, dropped
once its bucket is full again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from airlock.common.errors import AirlockError, ErrorCode

# What a record costs besides its payload: the chain's fields (time, kind, IDs, hashes) and its row.
RECORD_OVERHEAD: Final = 256


class JournalQuota:
    """Token buckets of journal bytes, one per agent uid; ``rate`` 0 turns the quota off."""

    def __init__(self, rate: int, burst: int, clock: Callable[[], float]) -> None:
        if rate < 0 or burst < 1:
            raise ValueError("the journal quota needs a rate of at least 0 and a burst of at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, when)
        self._limited: set[int] = set()  # refused since they were last admitted (logged once per spell)
        self.newly_limited = False  # the last refusal was the first of its spell

    def _tokens(self, uid: int, now: float) -> float:
        tokens, when = self._buckets.get(uid, (float(self.burst), now))
        return min(float(self.burst), tokens + max(0.0, now - when) * self.rate)

    def charge(self, uid: int | None, payload_bytes: int) -> None:
        """A record about ``uid`` was taken: its payload and the record's own fields."""
        if uid is None or self.rate == 0:
            return
        now = self._clock()
        self._buckets[uid] = (self._tokens(uid, now) - payload_bytes - RECORD_OVERHEAD, now)

    def admit(self, uid: int | None) -> None:
        """May a new request of ``uid`` begin?  Raises ``rate_limited`` while its bucket is in debt."""
        if uid is None or self.rate == 0:
            return
        now = self._clock()
        tokens = self._tokens(uid, now)
        if tokens > 0:
            self._limited.discard(uid)
            if tokens >= self.burst:
                self._buckets.pop(uid, None)  # full again: nothing to remember
            return
        self.newly_limited = uid not in self._limited
        self._limited.add(uid)
        wait = -tokens / self.rate
        raise AirlockError(
            ErrorCode.RATE_LIMITED,
            f"uid {uid} has written more to the audit journal than its quota allows "
            f"({self.rate} bytes/s, bursts of {self.burst}); retry in {wait:.1f} s",
            {"retry_after_seconds": round(wait, 1), "quota": "journal.agent_bytes_per_second"},
        )
