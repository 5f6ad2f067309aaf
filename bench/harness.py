"""What every airlock benchmark shares: the machine, a bench stack, clients, statistics, the table.

Benchmarks measure a figure and its yardstick side by side in one run (rounds
interleaved), so the ratio survives a noisy shared machine even when the
absolute numbers do not.  Nothing here is a test: results are printed and
written to bench/results.json, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.json"
SERVICES = ("intake", "approval", "runner", "journal")
BENCH_USER = "airlock-bench"
SUDOERS_DROPIN = Path("/etc/sudoers.d/airlock-bench")


# -- the machine ----------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the numbers were measured on: they mean little without it."""
    meminfo = Path("/proc/meminfo").read_text().split("\n")
    total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    debian = ""
    with contextlib.suppress(OSError):
        debian = Path("/etc/debian_version").read_text().strip()
    commit = ""  # what was measured (docs/benchmarks.md's table names it)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        commit = done.stdout.strip() if done.returncode == 0 else ""
    return {
        "commit": commit,
        "date": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(total_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_executable": os.path.realpath(sys.executable),
        "debian": debian,
        "root": os.geteuid() == 0,
        "hostname": socket.gethostname(),
    }


# -- statistics ---------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank: a p99 that is a real sample."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values)


@dataclass
class Figure:
    """One row of the table: a median value, its yardstick, and the target it is held to."""

    name: str
    value: float | None
    unit: str
    target: str = ""
    yardstick: str = ""
    yardstick_value: float | None = None
    ratio: float | None = None
    met: bool | None = None
    note: str = ""
    samples: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value:.2f} ms" if value < 100 else f"{value:.0f} ms"
    if unit in ("req/s", "appends/s", "MiB/s", "records/s"):
        return f"{value:,.0f} {unit}"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    return f"{value:g} {unit}"


def table(figures: list[Figure]) -> str:
    rows = [["figure", "value", "yardstick", "ratio", "target", "met"]]
    for f in figures:
        yard = f"{f.yardstick}: {fmt(f.yardstick_value, f.unit)}" if f.yardstick else "-"
        met = "-" if f.met is None else ("yes" if f.met else "NO")
        rows.append([f.name, fmt(f.value, f.unit), yard, "-" if f.ratio is None else f"{f.ratio:.2f}x", f.target, met])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {f.name}: {f.note}" for f in figures if f.note]
    return "\n".join(lines + (["", "notes:", *notes] if notes else []))


def write_results(figures: list[Figure], info: dict[str, Any], path: Path = RESULTS) -> None:
    previous: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        previous = json.loads(path.read_text())
    # A partial run (--only) keeps the other figures of the last full one.
    kept = {f["name"]: f for f in previous.get("figures", [])} if isinstance(previous, dict) else {}
    for f in figures:
        # When and under which load each figure was measured: a partial run's table mixes runs.
        when = {
            "measured_at": info.get("date"),
            "load_average": [info.get("load_average_start"), info.get("load_average_end")],
        }
        kept[f.name] = asdict(f) | {"extra": when | f.extra}
    path.write_text(json.dumps({"machine": info, "figures": list(kept.values())}, indent=2) + "\n")


# -- a stack to measure ---------------------------------------------------------


def bench_config(path: Path, *, root: bool, extra: dict[str, Any] | None = None) -> Path:
    """An `airlock dev up --config` file: policy that allows what the benches run.

    Privileged rules only when root (the dev runner cannot run as anyone else
    otherwise).  Logging stays at the default level: the cost of the audit
    trail and the logs is part of what is measured.
    """
    user = pwd.getpwuid(os.getuid()).pw_name
    commands = [
        ["/usr/bin/true"],
        ["/usr/bin/cat", "..."],
        ["/usr/bin/wc", "-c"],
        ["/usr/bin/head", "..."],
        ["/usr/bin/false"],
        ["/usr/bin/touch", "..."],
        ["/usr/bin/sleep", "..."],
    ]
    rules: list[dict[str, Any]] = [
        {"name": "bench-unprivileged", "decision": "allow", "users": [user], "privileged": False, "commands": commands},
    ]
    if root:
        rules.append(
            {"name": "bench-privileged", "decision": "allow", "users": [user], "privileged": True, "commands": commands}
        )
    config: dict[str, Any] = {
        "limits": {"max_connections": 256, "max_connections_per_agent": 256},  # the bench is one agent
        "policy": {"default": "deny", "rules": rules},
    }
    for section, values in (extra or {}).items():
        if section == "policy":
            config["policy"] = values
        else:
            config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class BenchStack:
    """`airlock dev up` in a temporary runtime folder, with a way to see its services."""

    def __init__(self, config: Path, runtime_dir: Path | None = None) -> None:
        self.config = config
        # Unix socket paths are limited to 108 bytes: keep the folder short.
        self.runtime_dir = runtime_dir or Path(tempfile.mkdtemp(prefix="alb-", dir="/tmp"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def agent(self) -> str:
        return str(self.runtime_dir / "agent.sock")

    @property
    def operator(self) -> str:
        return str(self.runtime_dir / "operator.sock")

    def spawn(self) -> None:
        """Start `dev up` and return at once (the cold-start figure times what follows)."""
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airlock",
                "dev",
                "up",
                "--runtime-dir",
                str(self.runtime_dir),
                "--config",
                str(self.config),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def start(self, timeout: float = 60) -> BenchStack:
        self.spawn()
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        seen = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen += line
            if b"ready" in line:
                return self
        self.stop()
        raise RuntimeError(f"airlock dev up did not become ready:\n{seen.decode(errors='replace')}")

    def pid(self, service: str) -> int | None:
        assert self.proc is not None
        # This tree's services are `python -m airlock.entry NAME`; an older tree's, airlock.NAME.
        pattern = rf"airlock\.(entry |runner\.)?{service}( |$)"
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-f", pattern], capture_output=True, text=True
        ).stdout.split()
        return int(out[0]) if out else None

    def rss_mib(self, service: str) -> float:
        pid = self.pid(service)
        if pid is None:
            return float("nan")
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def remove(self) -> None:
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def __enter__(self) -> BenchStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.remove()


# -- requests and clients ---------------------------------------------------------


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Requests:
    """Native request lines with fresh IDs, times and operation IDs.

    Each exec carries its own ``operation_id``, as a client that retries
    safely does (it costs the same as an unnamed one: intake names those).
    """

    def __init__(self) -> None:
        self.prefix = uuid.uuid4().hex[:12]
        self.n = 0

    def exec_line(self, args: dict[str, Any]) -> bytes:
        self.n += 1
        rid = f"b-{self.prefix}-{self.n}"
        body = {"time": now_iso(), "operation_id": f"op-{rid}"} | args
        return (
            json.dumps({"v": 1, "id": rid, "verb": "exec", "args": body, "token": None}, separators=(",", ":")).encode()
            + b"\n"
        )

    def ping_line(self) -> bytes:
        self.n += 1
        return b'{"v":1,"id":"p-%s-%d","verb":"ping","args":{},"token":null}\n' % (self.prefix.encode(), self.n)


class Persistent:
    """One blocking connection, many requests: the lowest-overhead client there is."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""

    def call(self, line: bytes) -> dict[str, Any]:
        self.sock.sendall(line)
        while True:
            nl = self.buf.find(b"\n")
            while nl >= 0:
                frame, self.buf = self.buf[:nl], self.buf[nl + 1 :]
                obj = json.loads(frame)
                if "event" not in obj:
                    return obj  # type: ignore[no-any-return]
                nl = self.buf.find(b"\n")
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed before the reply")
            self.buf += chunk

    def event(self, line: bytes, name: str) -> dict[str, Any]:
        """Send ``line`` and return the streamed event ``name`` (the final reply stays to be read with call)."""
        self.sock.sendall(line)
        while True:
            nl = self.buf.find(b"\n")
            while nl >= 0:
                frame, self.buf = self.buf[:nl], self.buf[nl + 1 :]
                obj = json.loads(frame)
                if obj.get("event") == name:
                    return obj  # type: ignore[no-any-return]
                if "event" not in obj:
                    raise ConnectionError(f"replied before {name}: {obj}")
                nl = self.buf.find(b"\n")
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"closed before {name}")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def approved_once(agent: Persistent, operator: Persistent, line: bytes) -> tuple[float, float]:
    """Send an exec that a rule asks about, approve it on operator.sock, wait for the agent's reply.

    Returns (the approve call, from the approve reply to the agent's final reply) in seconds."""
    pending = agent.event(line, "pending_approval")
    request_id = pending.get("request_id")
    approve = json.dumps(
        {"v": 1, "id": f"a-{request_id}", "verb": "approve", "args": {"id": request_id}, "token": None},
        separators=(",", ":"),
    )
    start = time.perf_counter()
    reply = operator.call(approve.encode() + b"\n")
    returned = time.perf_counter()
    if not reply.get("ok"):
        raise SystemExit(f"bench: approve failed: {reply}")
    final = agent.call(b"")
    done = time.perf_counter()
    if not final.get("ok"):
        raise SystemExit(f"bench: the approved exec failed: {final}")
    return returned - start, done - returned


def connect_when_bound(path: str, timeout: float) -> Persistent:
    """Connect as soon as `dev up` has bound the socket; the service behind it may still be starting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return Persistent(path)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


@dataclass
class Load:
    requests: int
    seconds: float
    errors: dict[str, int]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


async def _client(
    path: str,
    lines: Callable[[], bytes | None],
    errors: dict[str, int],
    done: list[int],
    on_reply: Callable[[int], None] | None,
) -> None:
    reader, writer = await asyncio.open_unix_connection(path, limit=64 * 1024 * 1024)
    try:
        while (line := lines()) is not None:
            writer.write(line)
            await writer.drain()
            while True:
                raw = await reader.readline()
                if not raw:
                    raise ConnectionError("closed before the reply")
                # Skip event lines without parsing the (possibly large) final reply twice.
                if raw.startswith(b'{"id"') and b'"event"' in raw[:200]:
                    continue
                break
            if b'"ok":true' not in raw:
                code = json.loads(raw).get("error", {}).get("code", "?")
                errors[code] = errors.get(code, 0) + 1
            done[0] += 1
            if on_reply is not None:
                on_reply(done[0])
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def drive(
    path: str, clients: int, total: int, make_line: Callable[[], bytes], on_reply: Callable[[int], None] | None = None
) -> Load:
    """``total`` requests over ``clients`` persistent connections, as fast as they are answered."""
    left = [total]

    def next_line() -> bytes | None:
        if left[0] <= 0:
            return None
        left[0] -= 1
        return make_line()

    errors: dict[str, int] = {}
    done = [0]

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(_client(path, next_line, errors, done, on_reply) for _ in range(clients)))
        return time.perf_counter() - start

    seconds = asyncio.run(main())
    return Load(done[0], seconds, errors)


# -- the sudo yardstick ------------------------------------------------------------


@contextlib.contextmanager
def sudo_yardstick() -> Iterator[str | None]:
    """A bench user with a NOPASSWD rule for /usr/bin/true; yields the user, or None (with why on stderr).

    Installs sudo with apt when root and missing; removes the drop-in (and the
    user, if it was made here) afterwards.
    """
    if os.geteuid() != 0:
        print("bench: not root: no sudo yardstick (it needs a NOPASSWD drop-in)", file=sys.stderr)
        yield None
        return
    if shutil.which("sudo") is None:
        print("bench: installing sudo for the yardstick", file=sys.stderr)
        apt_env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=apt_env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "sudo"], check=False, env=apt_env, stdout=subprocess.DEVNULL)
        if shutil.which("sudo") is None:
            print("bench: sudo could not be installed: no sudo yardstick", file=sys.stderr)
            yield None
            return
    made_user = False
    try:
        pwd.getpwnam(BENCH_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", BENCH_USER], check=True
        )
        made_user = True
    SUDOERS_DROPIN.write_text(
        f"# airlock bench yardstick; removed when the bench ends\n{BENCH_USER} ALL=(root) NOPASSWD: /usr/bin/true\n"
    )
    os.chmod(SUDOERS_DROPIN, 0o440)
    try:
        check = subprocess.run(["sudo", "-n", "/usr/bin/true"], user=BENCH_USER, capture_output=True, text=True)
        if check.returncode != 0:
            print(f"bench: sudo -n true as {BENCH_USER} failed: {check.stderr.strip()}", file=sys.stderr)
            yield None
        else:
            yield BENCH_USER
    finally:
        SUDOERS_DROPIN.unlink(missing_ok=True)
        if made_user:
            subprocess.run(["userdel", BENCH_USER], check=False)


def time_subprocess(argv: list[str], *, user: str | None = None, env: dict[str, str] | None = None) -> float:
    """Wall time of one fork/exec/wait, in seconds."""
    start = time.perf_counter()
    subprocess.run(
        argv,
        user=user,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - start
