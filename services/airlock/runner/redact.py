"""Protected values out of captured output, and output cut to a cap.

Pure: no I/O, byte handling only: the spawner feeds every chunk it reads through a
`StreamRedactor` and then a `Capture`, so streaming, evidence and digests all
see the same delivered bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

REDACTED = b"[redacted]"


def _compile(values: Iterable[str | bytes]) -> tuple[re.Pattern[bytes] | None, int]:
    """The pattern matching any value, and the longest value's length."""
    encoded = {v.encode() if isinstance(v, str) else bytes(v) for v in values}
    encoded.discard(b"")  # an empty value would "occur" between every two bytes
    if not encoded:
        return None, 0
    # Longest first: at one position the longest value wins, so a secret that
    # contains a shorter secret is still replaced whole.
    ordered = sorted(encoded, key=lambda v: (-len(v), v))
    return re.compile(b"|".join(re.escape(v) for v in ordered)), len(ordered[0])


def redact(data: bytes, values: Iterable[str | bytes], replacement: bytes = REDACTED) -> bytes:
    """Every occurrence of every value in ``data`` replaced (leftmost, longest first)."""
    pattern, _ = _compile(values)
    return data if pattern is None else pattern.sub(lambda _m: replacement, data)


class StreamRedactor:
    """`redact` for a stream that arrives in arbitrary chunks.

    Holds back just enough of the tail that a value straddling two reads is
    still seen whole: any chunking of the input yields exactly
    ``redact(b"".join(chunks))`` once `flush` is called at EOF.
    """

    __slots__ = ("_buffer", "_longest", "_pattern", "_replacement")

    def __init__(self, values: Iterable[str | bytes], replacement: bytes = REDACTED) -> None:
        self._pattern, self._longest = _compile(values)
        self._replacement = replacement
        self._buffer = b""

    @property
    def active(self) -> bool:
        return self._pattern is not None

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (and earlier held-back bytes) that are now final."""
        if self._pattern is None:
            return chunk
        buffer = self._buffer + chunk
        # A match (or a non-match) at position p is final only when every value
        # would fit from p on: otherwise a longer value may still complete there.
        limit = len(buffer) - self._longest + 1
        out: list[bytes] = []
        pos = 0
        for match in self._pattern.finditer(buffer):
            if match.start() >= limit:
                break
            out.append(buffer[pos : match.start()])
            out.append(self._replacement)
            pos = match.end()
        keep_from = max(pos, limit)
        out.append(buffer[pos:keep_from])
        self._buffer = buffer[keep_from:]
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever is held back, redacted; call once at EOF."""
        rest, self._buffer = self._buffer, b""
        if self._pattern is None:
            return rest
        replacement = self._replacement
        return self._pattern.sub(lambda _m: replacement, rest)


def _incomplete_utf8_tail(data: bytes | bytearray) -> int:
    """How many trailing bytes form the start of a UTF-8 character cut short (0..3)."""
    # Look back at most 3 bytes for a lead byte; continuation bytes are 10xxxxxx.
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        if 0xC2 <= byte <= 0xDF:
            need = 2
        elif 0xE0 <= byte <= 0xEF:
            need = 3
        elif 0xF0 <= byte <= 0xF4:
            need = 4
        else:
            return 0  # ASCII or not a lead byte: nothing to hold back
        return back if back < need else 0
    return 0


def cut_utf8(data: bytes, limit: int) -> bytes:
    """``data[:limit]``, shortened so that it never ends inside a UTF-8 character."""
    if len(data) <= limit:
        return data
    kept = data[:limit]
    return kept[: len(kept) - _incomplete_utf8_tail(kept)]


class Capture:
    """Bounded capture of one stream with in-order delivery to a listener.

    Keeps at most ``limit`` bytes; once more arrive it sets `truncated`, cuts
    before any UTF-8 character the cap would split, and ignores the rest (the
    caller keeps draining the pipe).  ``deliver`` sees exactly the kept bytes,
    with an incomplete trailing UTF-8 sequence held back until the next chunk,
    so a streamed copy never differs from the evidence and text consumers never
    get half a character.
    """

    __slots__ = ("_deliver", "_kept", "_limit", "_pending", "truncated")

    def __init__(self, limit: int, deliver: Callable[[bytes], None] | None = None) -> None:
        if limit < 0:
            raise ValueError(f"capture limit must not be negative (got {limit})")
        self._limit = limit
        self._deliver = deliver
        self._kept = bytearray()
        self._pending = b""
        self.truncated = False

    @property
    def held(self) -> int:
        """Bytes kept so far, a held-back tail included."""
        return len(self._kept) + len(self._pending)

    def add(self, data: bytes, allowed: int | None = None) -> None:
        """Keep ``data`` up to the cap; ``allowed``: at most this many of its bytes (a budget shared with
        other streams), past which the capture is truncated as at its own cap."""
        if self.truncated or not data:
            return
        buffer = self._pending + data
        room = self._limit - len(self._kept)
        if allowed is not None:
            room = min(room, len(self._pending) + max(allowed, 0))
        if len(buffer) > room:
            self.truncated = True
            self._pending = b""
            self._emit(cut_utf8(buffer, room))
            return
        tail = _incomplete_utf8_tail(buffer)
        self._pending = buffer[len(buffer) - tail :] if tail else b""
        self._emit(buffer[: len(buffer) - tail])

    def finish(self) -> bytes:
        """All kept bytes; call once at EOF (releases a held-back tail)."""
        pending, self._pending = self._pending, b""
        self._emit(pending)
        return bytes(self._kept)

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        self._kept += data
        if self._deliver is not None:
            self._deliver(data)
