"""Text for operators' eyes: sanitised, aligned, coloured only where that is safe.

Everything an agent chose (argv, reason, session, host, env names) passes
through `sanitise` before it reaches a terminal, so control characters,
escape sequences, bidi overrides, zero-width and wide characters cannot
repaint, reorder or hide what a reviewer is approving.  They are shown as
visible escapes (``\\x1b``, ``\\u202e``) instead.
"""

from __future__ import annotations

import os
import shlex
import unicodedata
from collections.abc import Iterable, Sequence
from typing import IO, Any
from urllib.parse import quote

from airlock.common import shown

# Unicode categories that draw nothing, draw over something else, or reorder text.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Mn", "Me"})


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def sanitise(text: object, *, strict: bool = False) -> str:
    """``text`` made safe to print: anything that could make the screen lie is escaped.

    ``strict`` escapes every non-ASCII character (for argv and paths, where a
    Cyrillic a (U+0430) must not pass for a Latin one); otherwise letters of any
    script stay readable and only invisible, reordering, combining, wide and
    unusual-space characters are escaped.  A backslash is doubled so an escape
    cannot be forged.
    """
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif " " <= ch <= "~":
            out.append(ch)
        elif strict or ch == "\t":
            out.append(_escape(ch))
        elif (
            unicodedata.category(ch) in _HIDDEN
            or unicodedata.category(ch) == "Zs"
            or unicodedata.east_asian_width(ch) in ("W", "F")
        ):
            out.append(_escape(ch))
        else:
            out.append(ch)
    return "".join(out)


def command_line(argv: Sequence[str]) -> str:
    """One stage as a shell would read it, every argument sanitised strictly."""
    return " ".join(shlex.quote(sanitise(arg, strict=True)) for arg in argv)


def shell_line(words: Sequence[str], *, ssh_host: str | None = None) -> str:
    """A command line an operator may paste into a POSIX shell: each word stays one word, nothing runs.

    With ``ssh_host`` the line is ``ssh HOST WORDS...``: ssh joins the words
    after the host with spaces and the remote shell parses them again, so each
    is quoted twice (once for each shell).  A word that needs no quoting is
    left as it is, so ``ssh db1 airlock approve r-1`` reads as it always did.
    """
    if ssh_host is None:
        return " ".join(shlex.quote(w) for w in words)
    return " ".join(["ssh", shlex.quote(ssh_host), *(shlex.quote(shlex.quote(w)) for w in words)])


def decision_line(command: str, request_id: str, *, host: str | None = None, options: tuple[str, ...] = ()) -> str:
    """The one place an ``airlock approve|deny ID [OPTIONS]`` line is built (issue 28): the relay's
    messages, ``airlock pending`` and ``airlock show``.

    Every word is quoted for the shell it is pasted into (twice after ``ssh
    HOST``: the remote shell reads it again).  An ID that starts with ``-``
    comes after ``--`` so it cannot be read as an option.  ``options`` are the
    command's flags (``--expect DIGEST``, ``--signature FILE``); add new ones here, not by formatting
    another line elsewhere.  ``command`` is the `airlock` command (approve, deny), not a wire verb.
    """
    words = ["airlock", command]
    if request_id.startswith("-"):
        words += [*options, "--", request_id]
    else:
        words += [request_id, *options]
    return shell_line(words, ssh_host=host)


def request_href(ref: str, web_url: str = "") -> str:
    """The one link to a request's page on airlock-web (issue 33): airlock-web's own pages (relative, no
    ``web_url``) and the relay's messages (``web.url``).  ``ref`` is ``AGENT/ID`` or an ID, quoted whole."""
    return f"{web_url.rstrip('/')}/request?ref={quote(ref, safe='')}"


def use_colour(stream: IO[str]) -> bool:
    # https://no-color.org: NO_COLOR set to anything but "" turns colour off.
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class Style:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)


def table(rows: Iterable[Sequence[object]], header: Sequence[str]) -> str:
    """Aligned columns, two spaces apart; cells are sanitised."""
    cells = [[sanitise(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in [list(header), *cells]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def fields(pairs: Iterable[tuple[str, object]]) -> str:
    """``label  value`` lines with the labels aligned (values already sanitised)."""
    items = list(pairs)
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def parse_ttl(text: str) -> int:
    """``90``, ``90s``, ``30m``, ``1h``, ``2d`` -> seconds (ValueError when it is none of them)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip().lower()
    factor = 1
    if value and value[-1] in units:
        factor = units[value[-1]]
        value = value[:-1]
    if not value.isdigit() or int(value) <= 0:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 30m, 1h, 2d)")
    return int(value) * factor


def file_review(request: dict[str, object]) -> list[tuple[str, str]]:
    """A pending file operation's lines for a reviewer: what, where, and the content it is bound to.

    ``before_sha256`` is the file the diff was made from ("absent": no file);
    the write happens only if the file still is exactly that.
    """
    if not request.get("tool"):
        return []
    pairs = [("file", f"{sanitise(request.get('tool'), strict=True)} {sanitise(request.get('path'), strict=True)}")]
    if request.get("tool") in ("files_write", "files_edit"):
        before = request.get("before_sha256")
        if before is None:
            error = request.get("preview_error")
            code = error.get("code") if isinstance(error, dict) else None
            requester = request.get("preview_as") == "requester"
            whose = " as the requesting agent (no rule names this path)" if requester else ""
            pairs.append(
                ("against", f"(no preview{whose}: {sanitise(code)}; the write is not bound to a reviewed content)")
            )
        else:
            pairs.append(
                ("against", f"sha256 {sanitise(before, strict=True)}" if before != "absent" else "absent (a new file)")
            )
            pairs.append(("after", f"sha256 {sanitise(request.get('after_sha256'), strict=True)}"))
            if request.get("diff_sha256") is not None and request.get("diff") is None:
                pairs.append(
                    (
                        "diff",
                        f"sha256 {sanitise(request.get('diff_sha256'), strict=True)}, "
                        f"{sanitise(request.get('diff_bytes'))} bytes (shown to operators only)",
                    )
                )
    return pairs


def diff_lines(diff: object) -> str:
    """A diff for a terminal: every line sanitised (file content is the agent's to choose)."""
    return "".join(sanitise(line) + "\n" for line in str(diff).splitlines())


def person(voter: dict[str, Any], *, fingerprint: bool = False) -> str:
    """An approver as a person (issue 27): the account, and the key's principal when they signed."""
    key = f" {voter.get('fingerprint')}" if fingerprint else ""
    if voter.get("principal") is None:
        return str(voter.get("user"))
    if voter.get("uid") is None:  # a principal mapped to no account
        return f"{voter.get('principal')} (unmapped key{key})"
    return f"{voter.get('user')} (key {voter.get('principal')}{key})"


def quorum_line(pending: dict[str, Any]) -> str:
    """Issue 18: "approvals: 1 of 2 (alice)" and the agent's reason, for pending, show and watch."""
    parts = []
    q = pending.get("quorum") or {}
    if q.get("needed", 1) > 1 or q.get("approvals"):
        who = ", ".join(person(v) for v in q.get("approvers") or [])
        parts.append(f"approvals: {q.get('progress')}" + (f" ({who})" if who else ""))
    if pending.get("reason"):
        parts.append(f"reason: {pending['reason']}")
    return sanitise("; ".join(parts))


def reviewer_line(opinion: object) -> str:
    """Issue 34: ``reviewer NAME: allow — reason``, raw (each surface escapes it as it escapes request values)."""
    if not isinstance(opinion, dict):
        return ""
    text = f"reviewer {opinion.get('name')}: {opinion.get('decision')}"
    if opinion.get("outcome") not in (None, "answered"):
        text += f" ({opinion.get('outcome')})"
    if opinion.get("reason"):
        text += f" — {opinion.get('reason')}"
    if opinion.get("why_not") and opinion.get("decision") != "ask":
        text += f" [not applied: {opinion.get('why_not')}]"
    return text


def cwd_and_stdin(pending: dict[str, Any]) -> list[tuple[str, str]]:
    """Issue 45: what the ticket binds of a pending command beyond its argv, binaries and run-as, sanitised:
    the working directory, stdin (size, sha256 and, for operators, the excerpt's lines), the environment's
    values, the limits the agent set and agent forwarding.  Nothing for a file operation."""
    if pending.get("cwd") is None:
        return []
    pairs = [
        ("cwd", sanitise(pending.get("cwd"), strict=True)),
        ("stdin", sanitise(shown.stdin_line(pending.get("stdin")))),
    ]
    request = pending.get("request")
    request = request if isinstance(request, dict) else {}
    pairs += [("  |", sanitise(line)) for line in shown.excerpt_lines(request.get("stdin_excerpt"))]
    raw_env = request.get("env")
    env: dict[str, Any] = raw_env if isinstance(raw_env, dict) else {}
    given = [f"{k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
    given += [f"{n} (protected)" for n in request.get("protected_names") or []]
    if given:
        pairs.append(("env", sanitise(" ".join(given))))
    limits = [
        f"{label} {request[key]}"
        for key, label in _LIMITS
        if isinstance(request.get(key), int) and not isinstance(request.get(key), bool)
    ]
    if limits:
        pairs.append(("limits", sanitise(", ".join(limits))))
    if request.get("forward_agent"):
        pairs.append(("ssh agent", "forwarded to the job"))
    return pairs


# The limits an agent may set on a command (spec fields), as `cwd_and_stdin` names them.
_LIMITS = (
    ("timeout_ms", "timeout ms"),
    ("deadline_ms", "deadline (Unix ms)"),
    ("max_output_bytes", "output bytes at most"),
)
