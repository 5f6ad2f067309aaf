"""What the stress tests share: stacks with a stress policy, a load generator, the audit checks, the tally.

Counts come from the environment so CI can run the same tests small:
``AIRLOCK_STRESS_N`` (requests in the load test, default 20,000; the fault
tests use a tenth of it, at least 200) and ``AIRLOCK_STRESS_CLIENTS``
(concurrent clients, default 32).

The two numbers every test reports, and that must stay 0:
- **lost**: a request answered ``ok`` (the work ran and was acknowledged)
  whose ``exec.finished`` is not in the journal;
- **unaudited**: a side effect (a marker file named after the request ID,
  made by the command itself) with no ``exec.started`` for that request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pwd
import sqlite3
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support import Stack, now_iso, start_stack, stop_stack

ROOT = os.geteuid() == 0
LARGE_OUTPUT = 1 << 20
SERVICES = ("intake", "approval", "runner", "journal")


def stress_n() -> int:
    return max(1, int(os.environ.get("AIRLOCK_STRESS_N", "20000")))


def stress_clients() -> int:
    return max(1, int(os.environ.get("AIRLOCK_STRESS_CLIENTS", "32")))


# -- stacks ----------------------------------------------------------------------------


def write_config(path: Path, **sections: dict[str, Any]) -> Path:
    """A `dev up --config` file: what the load needs allowed, everything else denied at once.

    Default deny (not ask) so a denied request answers at once; unprivileged
    only, so the same tests run as root and not.
    """
    user = pwd.getpwuid(os.getuid()).pw_name
    config: dict[str, Any] = {
        "limits": {
            "read_timeout_seconds": 2,
            "request_timeout_seconds": 4,
            "max_connections_per_agent": 64,
        },  # every client here is one agent (one uid)
        "policy": {
            "default": "deny",
            "rules": [
                {
                    "name": "stress-allowed",
                    "decision": "allow",
                    "users": [user],
                    "privileged": False,
                    "commands": [
                        ["/usr/bin/true"],
                        ["/usr/bin/false"],
                        ["/usr/bin/touch", "..."],
                        ["/usr/bin/head", "..."],
                        ["/usr/bin/sleep", "..."],
                    ],
                }
            ],
        },
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextlib.contextmanager
def running_stack(runtime: Path, **sections: dict[str, Any]) -> Iterator[Stack]:
    runtime.mkdir(parents=True, exist_ok=True)
    config = write_config(runtime.parent / f"{runtime.name}.yaml", **sections)
    stack = start_stack(runtime, config)
    try:
        yield stack
    finally:
        stop_stack(stack)


def service_fds(stack: Stack) -> dict[str, int]:
    out = {}
    for name in SERVICES:
        pid = stack.find_service_pid(name)
        out[name] = len(os.listdir(f"/proc/{pid}/fd")) if pid else -1
    return out


def service_rss_mib(stack: Stack) -> dict[str, float]:
    out = {}
    for name in SERVICES:
        pid = stack.find_service_pid(name)
        rss = float("nan")
        if pid:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
        out[name] = rss
    return out


# -- the load ----------------------------------------------------------------------------

# What each kind of request is, and the one answer it must get when nothing is broken.
KINDS = ("marker", "true", "denied_marker", "failing", "large", "invalid")
_WEIGHTS = (8, 3, 3, 3, 2, 1)


def kind_of(i: int) -> str:
    slot = i % sum(_WEIGHTS)
    for kind, weight in zip(KINDS, _WEIGHTS, strict=True):
        if slot < weight:
            return kind
        slot -= weight
    raise AssertionError("unreachable")


@dataclass
class Planned:
    """One request to send; its ``time`` is stamped when it is sent, so a long load stays fresh."""

    request_id: str
    kind: str
    body: dict[str, Any]

    def line(self) -> bytes:
        args = self.body | {"time": now_iso()}
        return json.dumps({"v": 1, "id": self.request_id, "verb": "exec", "args": args, "token": None}).encode() + b"\n"


class RequestMaker:
    """Fresh request lines of each kind.  Markers are files named after the request ID."""

    def __init__(self, markers: Path) -> None:
        self.markers = markers
        markers.mkdir(parents=True, exist_ok=True)
        os.chmod(markers, 0o777)
        self.prefix = uuid.uuid4().hex[:10]
        self.n = 0

    def make(self, kind: str, **extra: Any) -> Planned:
        self.n += 1
        rid = f"s-{self.prefix}-{self.n}"
        marker = str(self.markers / rid)
        args: dict[str, Any] = {
            "marker": {"argv": ["touch", marker]},
            "true": {"argv": ["true"]},
            # tee would create the marker if it ever ran: no rule allows it.
            "denied_marker": {"argv": ["tee", marker]},
            "failing": {"argv": ["false"]},
            "large": {"argv": ["head", "-c", str(LARGE_OUTPUT), "/dev/zero"]},
            "invalid": {"argv": ["touch", marker], "env": {"NOT_ALLOWED": "x"}},
        }[kind]
        body = args | {"privileged": False, "operation_id": f"op-{rid}"} | extra
        return Planned(rid, kind, body)


@dataclass
class Result:
    planned: Planned
    reply: dict[str, Any] | None = None
    connection_error: str | None = None
    seconds: float = 0.0


def well_formed(reply: Any, request_id: str) -> bool:
    if not isinstance(reply, dict) or reply.get("id") != request_id or not isinstance(reply.get("ok"), bool):
        return False
    if reply["ok"]:
        return isinstance(reply.get("data"), dict)
    error = reply.get("error")
    return isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("message"), str)


def expected(result: Result) -> str | None:
    """Why this answer is not the one its kind must get on a healthy stack (None: it is)."""
    reply, kind = result.reply, result.planned.kind
    if reply is None:
        return f"no reply ({result.connection_error})"
    code = None if reply["ok"] else reply["error"]["code"]
    if kind in ("denied_marker",):
        return None if code == "denied" else f"expected denied, got {code or 'ok'}"
    if kind == "invalid":
        return None if code == "invalid_arguments" else f"expected invalid_arguments, got {code or 'ok'}"
    if code is not None:
        return f"expected ok, got {code}: {reply['error']['message']}"
    data = reply["data"]
    exit_code = data["stages"][-1]["exit_code"]
    want = 1 if kind == "failing" else 0
    if exit_code != want:
        return f"expected exit {want}, got {exit_code}"
    if kind == "large" and len(base64.b64decode(data["stdout"])) != LARGE_OUTPUT:
        return "large output was not delivered whole"
    return None


async def _client(path: str, queue: asyncio.Queue[Planned | None], results: list[Result], timeout: float) -> None:
    """One agent: a persistent connection, reconnecting after a connection error."""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while (planned := await queue.get()) is not None:
        result = Result(planned)
        started = time.monotonic()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(path, limit=64 * 1024 * 1024), timeout
                )
            assert reader is not None
            writer.write(planned.line())
            await writer.drain()
            raw = await asyncio.wait_for(reader.readline(), timeout)
            if not raw.endswith(b"\n"):
                raise ConnectionResetError("closed before the reply")
            result.reply = json.loads(raw)
        except TimeoutError:
            result.connection_error = f"HANG: no reply within {timeout:g}s"
        except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
            result.connection_error = type(exc).__name__
        result.seconds = time.monotonic() - started
        if result.reply is None and writer is not None:
            writer.close()
            writer = reader = None
        results.append(result)
    if writer is not None:
        writer.close()


async def run_load(
    path: str, planned: list[Planned], clients: int, *, timeout: float = 120, results: list[Result] | None = None
) -> list[Result]:
    """Send every planned request once; ``results`` (if given) fills in as answers come."""
    queue: asyncio.Queue[Planned | None] = asyncio.Queue()
    for p in planned:
        queue.put_nowait(p)
    for _ in range(clients):
        queue.put_nowait(None)
    results = [] if results is None else results
    await asyncio.gather(*(_client(path, queue, results, timeout) for _ in range(clients)))
    return results


# -- the audit ---------------------------------------------------------------------------


def journal_index(stack: Stack) -> dict[str, set[str]]:
    """request_id -> the kinds journaled for it (read-only, beside the live journal), sealed segments included."""
    index: dict[str, set[str]] = {}

    def read(path: Path, query: str) -> None:
        with contextlib.closing(sqlite3.connect(f"file:{path}{query}", uri=True, timeout=30)) as conn:
            for kind, rid in conn.execute("SELECT kind, request_id FROM events WHERE request_id IS NOT NULL"):
                index.setdefault(rid, set()).add(kind)

    # The live file first, then the sealed ones: a rollover in between seals what was read into a file
    # listed after it (read twice, which an index does not mind), never into one missed.
    read(stack.database, "?mode=ro")
    state = stack.database.parent
    for path in sorted((state / "segments").glob("journal-*.db")) + sorted((state / "journal-archive").glob("*.db")):
        read(path, "?mode=ro&immutable=1")
    return index


@dataclass
class Audit:
    lost: list[str] = field(default_factory=list)
    unaudited: list[str] = field(default_factory=list)
    unacknowledged_runs: int = 0


def audit(stack: Stack, results: list[Result], markers: Path) -> Audit:
    index = journal_index(stack)
    found = Audit()
    ours = {r.planned.request_id for r in results}
    for r in results:
        if r.reply is not None and r.reply.get("ok") and "exec.finished" not in index.get(r.planned.request_id, set()):
            found.lost.append(r.planned.request_id)
    for marker in os.listdir(markers):
        if "exec.started" not in index.get(marker, set()):
            found.unaudited.append(marker)
    acknowledged = {r.planned.request_id for r in results if r.reply is not None and r.reply.get("ok")}
    started = {rid for rid in ours if "exec.started" in index.get(rid, set())}
    found.unacknowledged_runs = len(started - acknowledged)
    return found


def verify_chain(stack: Stack) -> dict[str, Any]:
    """The chain's verdict; and every request's story must be one the lifecycle table allows
    (`airlock audit verify --lifecycle`: 0 violations)."""
    reply = stack.native("audit.verify", {}, path=stack.operator)
    assert reply["ok"], reply
    checked = stack.cli("audit", "verify", "--lifecycle", "--anchors", "none", "--json", timeout=300)
    lifecycle = json.loads(checked.stdout)["data"]["lifecycle"]
    assert lifecycle["violation_count"] == 0, lifecycle["violations"][:10]
    assert checked.returncode == 0 or not reply["data"]["ok"], checked.stdout[-2000:] + checked.stderr
    return dict(reply["data"]) | {"lifecycle": lifecycle}


# -- the tally every test adds to; printed at the end of the session ------------------------


@dataclass
class Tally:
    rows: list[tuple[str, int, int, Counter[str], int, int]] = field(default_factory=list)

    def add(
        self, test: str, results: list[Result], found: Audit | None = None, *, extra: Counter[str] | None = None
    ) -> None:
        codes: Counter[str] = Counter()
        answers = 0
        for r in results:
            if r.reply is None:
                codes["(connection error)" if not (r.connection_error or "").startswith("HANG") else "(HANG)"] += 1
                continue
            answers += 1
            codes["ok" if r.reply.get("ok") else r.reply["error"]["code"]] += 1
        codes.update(extra or Counter())
        self.rows.append(
            (test, len(results), answers, codes, len(found.lost) if found else 0, len(found.unaudited) if found else 0)
        )

    def render(self) -> str:
        lines = [f"{'test':<34} {'requests':>8} {'answers':>8} {'lost':>5} {'unaudited':>9}  by code"]
        for test, n, answers, codes, lost, unaudited in self.rows:
            by = ", ".join(f"{c} {k}" for c, k in sorted(codes.items(), key=lambda kv: -kv[1]))
            lines.append(f"{test:<34} {n:>8} {answers:>8} {lost:>5} {unaudited:>9}  {by}")
        total = [sum(r[i] for r in self.rows) for i in (1, 2, 4, 5)]
        lines.append(f"{'total':<34} {total[0]:>8} {total[1]:>8} {total[2]:>5} {total[3]:>9}")
        return "\n".join(lines)


def mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a small tmpfs (root only); returns why not, or None."""
    if not ROOT:
        return "needs root to mount a small tmpfs"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], capture_output=True, text=True
    )
    return None if done.returncode == 0 else f"cannot mount a tmpfs: {done.stderr.strip()}"


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte; returns the filler file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 512, 1):
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    f.write(block)
    return filler
