"""Line framing with a size limit, with no I/O: the one framing every socket uses.

A frame is one line ending in exactly ``\\n``; the cap (newline included) is
checked before anything is parsed, and a final line without its newline is
its own error.  The sockets stop at an overlong line; a stream that goes on
after one (the gateway's and the MCP server's stdin) asks `FrameDecoder` to
skip it instead, and each turns the error into its own dialect.  Kept apart from the codec so the `airlock` command
can read
replies without importing the envelope's dataclasses (start-up time).

Pure: no I/O.
"""

from __future__ import annotations

import enum
from typing import Final

from airlock.common.errors import AirlockError, ErrorCode

DEFAULT_MAX_LINE: Final = 1024 * 1024


class _NeedData(enum.Enum):
    NEED_DATA = "need_data"


NEED_DATA: Final = _NeedData.NEED_DATA


class FrameDecoder:
    """Splits a byte stream into lines of at most ``max_bytes`` (newline included).

    With ``skip_overlong`` an overlong line is reported once (the same error)
    and then dropped up to its newline, and the stream goes on; without it the
    stream has failed.  Right after the error, `peek` still shows how the
    overlong line began.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_LINE, *, skip_overlong: bool = False) -> None:
        if max_bytes < 2:
            raise ValueError("max_bytes must allow at least one byte and the newline")
        self.max_bytes = max_bytes
        self.skip_overlong = skip_overlong
        self._buffer = bytearray()
        self._failed = False
        self._skipping = False

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def peek(self, limit: int) -> bytes:
        """The first ``limit`` buffered bytes (what a failed line began with, for an error reply)."""
        return bytes(self._buffer[:limit])

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_frame(self) -> bytes | _NeedData:
        """Return the next line without its newline, or NEED_DATA.

        Raises `AirlockError(request_too_large)` as soon as more than
        ``max_bytes`` arrive without a newline, so a peer cannot make us buffer
        without bound.
        """
        if self._failed:
            raise AirlockError(ErrorCode.INVALID_REQUEST, "stream already failed")
        if self._skipping:
            # Drop the rest of an overlong line, up to and including its newline.
            end = self._buffer.find(b"\n")
            if end < 0:
                self._buffer.clear()
                return NEED_DATA
            del self._buffer[: end + 1]
            self._skipping = False
        end = self._buffer.find(b"\n", 0, self.max_bytes)
        if end < 0:
            if len(self._buffer) >= self.max_bytes:
                if self.skip_overlong:
                    self._skipping = True
                else:
                    self._failed = True
                raise _too_large(self.max_bytes)
            return NEED_DATA
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    def rest(self) -> bytes:
        """The bytes after the last whole line (none while an overlong line is being skipped)."""
        return b"" if self._skipping else bytes(self._buffer)

    def end_of_stream(self) -> None:
        """The peer closed its side: leftover bytes are a line without its newline."""
        if self._buffer and not self._failed:
            self._failed = True
            raise AirlockError(
                ErrorCode.MISSING_NEWLINE,
                "missing trailing newline: the request must end with \\n",
                {"received_bytes": len(self._buffer)},
            )


def _too_large(limit: int) -> AirlockError:
    return AirlockError(
        ErrorCode.REQUEST_TOO_LARGE,
        f"request exceeds {limit} bytes (newline included)",
        {"limit_bytes": limit},
    )
