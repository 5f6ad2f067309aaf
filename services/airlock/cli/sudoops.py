"""Which operation an agent's `sudo` names (issue 48): a retry after the agent's tool timed out is the same one.

Agent tools kill a command after a minute or two while a person has not
decided; the agent then types the same `sudo` again.  That retry must join
the request still pending (or running), or get the result of the job that
ran while nobody listened, never ask twice or run twice.  airlock's
operations (reference/001, journal/operations.py) already do that for a
client that names the same operation twice, so the front names it from what
the agent asked: its session, the command, the directory, the account, the
environment and a digest of stdin (`intent`), plus the bucket of
``agents.retry_window_seconds`` it falls in (`choose`).

A result the front printed is delivered: typing the same command again after
that is a new intent, so the front keeps a small record per user of the
operations it started and delivered (`Record`) and counts on from there.
The record also carries a retry across a bucket's edge.  Without a place to
keep it (no writable runtime or cache folder) the name is the bucket's alone.
Pure but for `load` and `save`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_RECORDS = 256


def intent(
    uid: int,
    session: str,
    argv: tuple[str, ...],
    cwd: str | None,
    run_as: str,
    env: dict[str, str],
    stdin: bytes | None,
) -> str:
    """A digest of everything that makes two `sudo` lines the same request."""
    body = {
        "uid": uid,
        "session": session,
        "argv": list(argv),
        "cwd": cwd,
        "run_as": run_as,
        "env": dict(sorted(env.items())),
        "stdin": hashlib.sha256(stdin).hexdigest() if stdin is not None else None,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Record:
    """One operation the front started for an intent: its name, when, and whether its result was printed."""

    operation_id: str
    started: float
    delivered: bool = False
    seq: int = 0


def choose(key: str, now: float, window: float, records: dict[str, Record]) -> Record:
    """The operation for intent ``key`` now: the undelivered one still in the window, else a new name."""
    window = max(float(window), 1.0)
    known = records.get(key)
    if known is not None and not known.delivered and now - known.started < window:
        return known  # a retry: join it, or get the result nobody read
    base = f"sudo-{key[:32]}-{int(now // window)}"
    seq = known.seq + 1 if known is not None and known.operation_id.startswith(base) else 0
    return Record(base if seq == 0 else f"{base}.{seq}", now, False, seq)


def _folder() -> Path | None:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "airlock-sudo"
    home = os.environ.get("HOME")
    return Path(home) / ".cache" / "airlock-sudo" if home and home != "/" else None


def load() -> dict[str, Record]:
    """The user's record of operations (empty when there is none, or it cannot be read)."""
    folder = _folder()
    if folder is None:
        return {}
    try:
        raw: Any = json.loads((folder / "operations.json").read_text(encoding="utf-8"))
        return {str(k): Record(str(v[0]), float(v[1]), bool(v[2]), int(v[3])) for k, v in raw.items()}
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        return {}


def save(records: dict[str, Record], now: float, window: float) -> None:
    """Keep the records still worth having (best effort: a front that cannot write names by bucket alone)."""
    folder = _folder()
    if folder is None:
        return
    kept = sorted(
        ((k, r) for k, r in records.items() if now - r.started < 2 * max(window, 1.0)), key=lambda kr: kr[1].started
    )[-MAX_RECORDS:]
    body = {k: [r.operation_id, r.started, r.delivered, r.seq] for k, r in kept}
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = folder / f".operations.{os.getpid()}"
        tmp.write_text(json.dumps(body), encoding="utf-8")
        os.replace(tmp, folder / "operations.json")
