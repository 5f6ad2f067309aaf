"""Each channel's pace: a token bucket a worker waits on before every send."""

from __future__ import annotations

import threading
import time


class RateLimit:
    """A token bucket: ``per_minute`` messages a minute, bursts up to that many."""

    def __init__(self, per_minute: int) -> None:
        self.capacity = float(per_minute)
        self.tokens = float(per_minute)
        self.rate = per_minute / 60.0
        self.stamp = time.monotonic()

    def wait(self, stop: threading.Event) -> bool:
        """Take one token, waiting for it; False when stopped meanwhile."""
        while not stop.is_set():
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            stop.wait((1 - self.tokens) / self.rate)
        return False
