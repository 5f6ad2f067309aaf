"""What a person is shown of a job's working directory and standard input (issue 45).

Both are bound to the ticket (the spec's digest), so both decide what an
approved job does: ``chpasswd`` reads its passwords from stdin, ``chown -R
agent .`` acts on its cwd.  Every surface that puts a request in front of a
person shows them, from the values built here:

- the cwd: the request's, or the runner's default (``/`` for root, the user's
  home otherwise: runner/identity.py ``default_cwd``), said as a default;
- stdin: its size and sha256 (of the bytes the job reads, not of the base64
  on the wire: what ``sha256sum`` prints) everywhere, records included;
  an excerpt only on operators' surfaces (the first lines of text, or a hex
  excerpt of binary), which each surface escapes for itself; the whole of
  it only through ``airlock show ID --stdin``, for operators, while the
  request is pending.  Like a write's diff (issue 39), stdin is content an
  agent chose and may carry secrets (a password for ``chpasswd``): the
  journal, the events feed, the relay and journald hold digest and size only.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any, Final

EXCERPT_LINES: Final = 5  # the first lines of a text stdin an operator is shown
EXCERPT_LINE_CHARS: Final = 160  # each clipped to this many characters
EXCERPT_HEX_BYTES: Final = 32  # of a binary stdin: the first bytes, in hex
ROOT_DEFAULT_CWD: Final = "/"


def raw(stdin: str | None) -> bytes | None:
    """The bytes the job reads from the spec's base64 ``stdin`` (None: /dev/null)."""
    if stdin is None:
        return None
    try:
        return base64.b64decode(stdin, validate=True)
    except (binascii.Error, ValueError):
        return stdin.encode("utf-8", "surrogateescape")  # checked at intake; never fails there


def summary(stdin: str | None) -> dict[str, Any] | None:
    """``{"bytes": N, "sha256": HEX}`` of the job's stdin, or None without one: what records and everyone see."""
    data = raw(stdin)
    if data is None:
        return None
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def excerpt(stdin: str | None) -> dict[str, Any] | None:
    """What an operator sees of the content: ``{"text": [lines], "more": bool}`` for UTF-8 text without NUL,
    else ``{"hex": "..", "more": bool}``.  Unescaped: each surface neutralises it for itself."""
    data = raw(stdin)
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        head = data[:EXCERPT_HEX_BYTES]
        return {"hex": head.hex(" "), "more": len(data) > len(head)}
    all_lines = text.splitlines()
    first = all_lines[:EXCERPT_LINES]
    clipped = [line if len(line) <= EXCERPT_LINE_CHARS else line[: EXCERPT_LINE_CHARS - 1] + "…" for line in first]
    more = len(all_lines) > len(first) or clipped != first
    return {"text": clipped, "more": more}


def stdin_line(described: Any) -> str:
    """A summary (`summary`, or its journaled form) as one line: ``none`` or ``N bytes, sha256 HEX``.

    A string is a spec's base64 (a record written before issue 45): summarised here."""
    if isinstance(described, str):
        described = summary(described)
    if not isinstance(described, dict):
        return "none"
    return f"{described.get('bytes')} bytes, sha256 {described.get('sha256')}"


def cwd_line(cwd: object, *, privileged: bool) -> str:
    """Where the job starts: the request's cwd, or the runner's default, said as one."""
    if isinstance(cwd, str) and cwd:
        return cwd
    if privileged:
        return f"{ROOT_DEFAULT_CWD} (default for root)"
    return "the user's home (default)"


def excerpt_lines(found: Any) -> list[str]:
    """An excerpt (`excerpt`) as plain lines, not yet escaped: the text's lines, or ``hex: ..``; ``…`` if cut."""
    if not isinstance(found, dict):
        return []
    if isinstance(found.get("hex"), str):
        out = [f"hex: {found['hex']}"]
    else:
        out = [str(line) for line in found.get("text") or []]
    if found.get("more"):
        out.append("…")
    return out


def excerpt_all(data: bytes) -> list[str]:
    """All of a stdin as lines for a terminal, not yet escaped: text's lines, or 16 bytes of hex a line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\x00" not in text:
        return text.splitlines()
    return [f"{i:08x}  {data[i : i + 16].hex(' ')}" for i in range(0, len(data), 16)]


def journaled(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec's dict as a record holds it: stdin by size and sha256 (`summary`), never its bytes."""
    stdin = spec.get("stdin")
    if not isinstance(stdin, str):
        return spec
    return spec | {"stdin": summary(stdin)}
