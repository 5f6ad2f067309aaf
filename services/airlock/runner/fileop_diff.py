"""What a write would change, as an operator reads it: a unified diff, or a binary change in hex.

Pure: no I/O; `runner.fileop_perform` hands it the old and new content.
Text is strict UTF-8 and shown as a unified diff (a last line without a
newline marked as diff(1) marks it).  Content that does not decode is never
decoded with replacement characters -- two different byte strings would
then show as the same text, and a real change as an empty diff (issue 39)
-- but shown as a binary change: both sizes, where the change starts, how
many bytes it replaces, and ``xxd``-like rows of both sides there.
"""

from __future__ import annotations

import difflib

DIFF_LIMIT = 64 * 1024
BINARY_EXCERPT = 64  # bytes of hex shown on each side of a binary change


def unified_diff(path: str, before: bytes | None, after: bytes) -> str:
    """``before`` (None: no file) -> ``after`` at ``path``, as text or as a binary change (see the module)."""
    fromfile = path if before is not None else "/dev/null"
    try:
        old = (before or b"").decode("utf-8").splitlines(keepends=True)
        new = after.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        diff = binary_diff(fromfile, path, before or b"", after)
    else:
        diff = "".join(_ended(line) for line in difflib.unified_diff(old, new, fromfile=fromfile, tofile=path))
    if len(diff) > DIFF_LIMIT:
        diff = diff[:DIFF_LIMIT] + "\n[diff truncated]\n"
    return diff


def _ended(line: str) -> str:
    # difflib leaves a last line without its newline, which would run into the next line.
    return line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n"


def binary_diff(fromfile: str, tofile: str, before: bytes, after: bytes) -> str:
    """A change to content that is not UTF-8 text: sizes, the changed byte range, hex excerpts of both sides."""
    head = f"--- {fromfile}\n+++ {tofile}\n"
    if before == after:
        return ""
    start = 0
    limit = min(len(before), len(after))
    while start < limit and before[start] == after[start]:
        start += 1
    end = 0  # bytes equal at the end of both, not overlapping the start
    while end < limit - start and before[-1 - end] == after[-1 - end]:
        end += 1
    old_changed, new_changed = len(before) - start - end, len(after) - start - end
    at = start - start % 16
    lines = [
        f"binary change (not UTF-8 text): {len(before)} -> {len(after)} bytes; "
        f"from byte {start} (0x{start:x}), {old_changed} bytes replaced by {new_changed}\n"
    ]
    lines += [f"-{row}\n" for row in _hexdump(before, at, start + old_changed)]
    lines += [f"+{row}\n" for row in _hexdump(after, at, start + new_changed)]
    return head + "".join(lines)


def _hexdump(data: bytes, at: int, changed_end: int) -> list[str]:
    """``xxd``-like rows of ``data`` from offset ``at``: up to `BINARY_EXCERPT` bytes, through the change if shorter."""
    stop = min(len(data), at + BINARY_EXCERPT, max(changed_end, at + 16))
    rows = []
    for offset in range(at, stop, 16):
        chunk = data[offset : min(offset + 16, stop)]
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        rows.append(f"{offset:08x}  {chunk.hex(' ', 1):<47}  |{text}|")
    if not rows:
        rows.append(f"{at:08x}  (end of file)")
    elif stop < changed_end:
        rows.append(f"{stop:08x}  [{changed_end - stop} more changed bytes]")
    return rows
