"""A helper process that walks one span of the chain (journal/spans.py) on the machine's second core.

`Helper.start` runs ``python3 -I -S -B`` with journal/spanchild.py's `main`: it
opens the database read-only, walks the span's rows with `fastwalk.verify_stored` from
the span's link and prints the result as one JSON line.  The parent reads it
with a deadline (`Helper.result`); any other outcome -- no start, a crash, a
timeout, a line that is not a result -- is None, and the parent walks the
span itself (`spans.walk_spans`): a helper can only save time, never decide.

It starts, waits for and stops a process; the process reads the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import airlock
from airlock.common import child, log
from airlock.journal.chain import VerifyResult, is_hash
from airlock.journal.spans import Span

_PACKAGE_ROOT: Final = os.path.dirname(os.path.dirname(os.path.abspath(airlock.__file__)))
# -I: no environment, no user site, no script directory; -S: no site (the walk needs the standard
# library only; ~5 ms of its start); the package goes first on sys.path, whatever the parent's path set-up.
_ENTRY: Final = (
    "import sys; sys.path.insert(0, sys.argv[1]); from airlock.journal.spanchild import main; sys.exit(main())"
)
_OUTPUT_CAP: Final = 64 * 1024
STOP_GRACE: Final = 1.0


class Helper:
    """One helper process walking one span; `result` waits for it, `stop` ends it (both bounded)."""

    def __init__(self, proc: subprocess.Popen[bytes], part: Span) -> None:
        self.proc = proc
        self.part = part

    @classmethod
    def start(cls, path: str, part: Span) -> Helper | None:
        """The helper walking ``part`` of the database at ``path``, or None if it cannot start."""
        database = str(Path(path).resolve())
        argv = [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", _ENTRY, _PACKAGE_ROOT, database]
        argv += [str(part.first), str(part.last), part.link]
        try:
            proc = subprocess.Popen(  # noqa: S603 -- our own interpreter and module, argv only
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child.environment(),
                cwd="/",
                close_fds=True,
                # Its own session, as common/child.py's helpers: a process group a stop reaches whole, and
                # (with the kernel's autogroup) a CPU share of its own rather than half of the caller's.
                start_new_session=True,
            )
        except OSError as exc:
            log.get().warning("journal.span_helper.failed", reason=f"cannot start: {exc.strerror or exc}")
            return None
        return cls(proc, part)

    def result(self, timeout: float) -> VerifyResult | None:
        """The span's result, or None (logged) if the helper gave none within ``timeout`` seconds."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            log.get().warning("journal.span_helper.failed", reason=f"no answer within {timeout:.1f} s")
            return None
        found = parse_result(out[:_OUTPUT_CAP]) if self.proc.returncode == 0 else None
        if found is None:
            log.get().warning(
                "journal.span_helper.failed",
                reason=child.exit_text(self.proc.returncode) if self.proc.returncode else "no result",
                stderr=err[-400:].decode("utf-8", "replace"),
            )
        return found

    def stop(self) -> None:
        child.stop_all([self.proc], STOP_GRACE)
        with contextlib.suppress(OSError, ValueError):
            self.proc.communicate(timeout=STOP_GRACE)


def parse_result(out: bytes) -> VerifyResult | None:
    """A `VerifyResult` from the helper's one JSON line, or None if it is not exactly one."""
    try:
        data = json.loads(out)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or set(data) != {"ok", "checked", "first_bad_seq", "reason", "head_seq", "head_hash"}:
        return None
    ok, checked, bad, reason, head_seq, head_hash = (
        data[k] for k in ("ok", "checked", "first_bad_seq", "reason", "head_seq", "head_hash")
    )
    if not (
        type(ok) is bool
        and type(checked) is int
        and type(head_seq) is int
        and is_hash(head_hash)
        and (bad is None or type(bad) is int)
        and (reason is None or isinstance(reason, str))
    ):
        return None
    return VerifyResult(ok, checked, bad, reason, head_seq, head_hash)
