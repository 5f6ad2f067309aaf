"""Each job's output kept by the runner: a gzip log per job, bounded, pruned, followed live.

What is kept is what the job delivered, chunk by chunk as the spawner read it:
already redacted (protected values and credentials, redact.py) and cut to the
request's caps, so the log never holds a byte the agent could not have got.
A job's log holds at most ``runner.output_log_max_bytes`` of output; past it
the log is cut and ends with a note saying so, and the chain's ``exec.finished``
says ``cut`` too.  The chain holds each stream's length and SHA-256 of the
bytes stored (equal to the evidence's ``stdout_sha256``/``stderr_sha256``
when nothing was cut) and ``log_sha256``, the SHA-256 of the whole log as
written (its header line and every frame: kind, stage, time, length and
bytes, in order, the notes airlock wrote among them), so `airlock show ID
--output` can say whether the file still matches: a forged note or frames
put in another order change ``log_sha256`` though every stream's digest
stays (issue 51).

File format (inside gzip): the line ``AIRLOCK-OUTPUT 1``, then frames of a
header ``>BBII`` (kind 0 stdout, 1 stderr, 2 note; stage; milliseconds since
the job started; length) and that many bytes.  A job that printed nothing
leaves no file.  Files are named ``<UTC start>-<random>.<group>.out.gz`` (the
name is the runner's, journaled in ``exec.started``; no request value reaches
a path; the group, ``u<uid>`` or ``r<uid>``, is whose budget the log counts
in: runner/outputkeep.py, which prunes them) in ``runner.output_dir`` (root,
0700).  Logs named before groups (no ``.<group>``) are still read.

Following (`airlock logs ID --follow`): a running job's log keeps its last
`TAIL_BYTES` in memory and a bounded queue per follower; a follower that does
not keep up loses chunks (a marker says how many bytes), never slows the job.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import secrets
import stat
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode

MAGIC = b"AIRLOCK-OUTPUT 1\n"
_FRAME = struct.Struct(">BBII")
STDOUT, STDERR, NOTE = 0, 1, 2
KINDS = {STDOUT: "stdout", STDERR: "stderr", NOTE: "note"}
_NAME = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{16}(?:\.([ur](?:0|[1-9][0-9]{0,9})))?\.out\.gz")
_WRITE_BATCH = 64 * 1024  # compressed bytes gathered before a write(2)
TAIL_BYTES = 64 * 1024  # what a new follower gets of the output so far
FOLLOW_QUEUE_BYTES = 1024 * 1024  # per follower, before chunks are dropped
# Reading a log back: decompress no more than this beyond the per-job bound (frames, notes).
_READ_SLACK = 64 * 1024
# Each delivered byte could be its own frame (a job alternating stdout and stderr): what reading may decompress.
_FRAME_GROWTH = 1 + _FRAME.size
_COALESCE = 64 * 1024  # consecutive chunks of one stream share a frame up to this size
# A log read back keeps the order of at most this many stream switches; past it, the rest per stream.
MAX_CHUNKS = 4096


def valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def group(requester: int, *, root: bool) -> str:
    """Whose retention budget a log counts in: ``r<uid>`` (a root job ``uid`` asked for) or ``u<uid>``."""
    return f"{'r' if root else 'u'}{int(requester)}"


def group_of(name: str) -> str:
    """A log's group from its name ("" for a log named before groups)."""
    found = _NAME.fullmatch(name)
    return (found.group(1) or "") if found else ""


def new_name(now: float | None = None, owner: str | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(8)}{'.' + owner if owner else ''}.out.gz"


def open_dir(path: Path) -> int:
    """The output directory as an fd: created root-only if missing, refused if a symlink or not root's alone."""
    with contextlib.suppress(FileExistsError):
        os.makedirs(path, mode=0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise AirlockError(
            ErrorCode.INTERNAL,
            f"{path}: the output log directory must be the runner's alone (mode 0700), "
            f"not uid {st.st_uid} mode {stat.S_IMODE(st.st_mode):04o}",
        )
    return fd


@dataclass(eq=False)  # followers are kept in a set, by identity
class _Follower:
    queue: collections.deque[tuple[int, int, bytes]] = field(default_factory=collections.deque)
    queued: int = 0
    dropped: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False


class OutputLog:
    """One job's log while it runs: `add` each delivered chunk; `close` returns the chain's summary."""

    def __init__(self, directory: Path, name: str, limit: int, header: dict[str, Any]) -> None:
        self.directory = directory
        self.name = name
        self.limit = limit
        self.header = header
        self.started = time.monotonic()
        self.stored = 0
        self.cut = False
        self.digests: dict[tuple[int, int], Any] = {}  # (kind, stage) -> sha256 object
        self.whole = hashlib.sha256()  # the log as written, every byte before compression
        self.sizes: dict[tuple[int, int], int] = {}
        self._fd = -1
        self._compressor: Any = None
        self._pending = bytearray()
        self._open_frame: list[Any] | None = None  # [kind, stage, ms, bytearray]: not yet compressed
        self.failed: str | None = None  # the log could not be written (the job runs on regardless)
        self.tail: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self._tail_bytes = 0
        self.followers: set[_Follower] = set()

    # --- writing ------------------------------------------------------------------

    def add(self, stream: str, stage: int, data: bytes) -> None:
        """One delivered chunk (already redacted and capped); never raises."""
        kind = STDOUT if stream == "stdout" else STDERR
        if not data:
            return
        self._publish(kind, stage, data)
        if self.cut or self.failed is not None:
            return
        room = self.limit - self.stored
        if len(data) > room:
            data = data[:room]
            self.cut = True
        if data:
            key = (kind, stage)
            self.digests.setdefault(key, hashlib.sha256()).update(data)
            self.sizes[key] = self.sizes.get(key, 0) + len(data)
            self.stored += len(data)
            self._frame(kind, stage, data)
        if self.cut:
            self._frame(NOTE, 0, f"[airlock: output log cut at {self.limit} bytes]".encode())

    def _frame(self, kind: int, stage: int, data: bytes) -> None:
        """Add ``data`` to the open frame of its stream, or close that frame and open another."""
        current = self._open_frame
        if (
            current is not None
            and (current[0], current[1]) == (kind, stage)
            and len(current[3]) + len(data) <= _COALESCE
        ):
            current[3] += data
            return
        self._close_frame()
        ms = min(int((time.monotonic() - self.started) * 1000), 0xFFFFFFFF)
        self._open_frame = [kind, stage, ms, bytearray(data)]
        if kind == NOTE:
            self._close_frame()

    def _close_frame(self) -> None:
        current, self._open_frame = self._open_frame, None
        if current is None or self.failed is not None:
            return
        kind, stage, ms, data = current
        try:
            if self._compressor is None:
                self._open()
            frame = _FRAME.pack(kind, stage, ms, len(data)) + bytes(data)
            self.whole.update(frame)
            self._pending += self._compressor.compress(frame)
            if len(self._pending) >= _WRITE_BATCH:
                self._write()
        except (OSError, AirlockError) as exc:
            self._fail(exc)

    def _open(self) -> None:
        dirfd = open_dir(self.directory)
        try:
            self._fd = os.open(
                self.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd
            )
        finally:
            os.close(dirfd)
        self._compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        head = MAGIC + json.dumps(self.header, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        self.whole.update(head)
        self._pending += self._compressor.compress(head)

    def _write(self) -> None:
        view = memoryview(bytes(self._pending))
        self._pending.clear()
        while view:
            view = view[os.write(self._fd, view) :]

    def _fail(self, exc: OSError | AirlockError) -> None:
        self.failed = (exc.message if isinstance(exc, AirlockError) else exc.strerror or type(exc).__name__)[:256]
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._compressor = None

    def close(self) -> dict[str, Any]:
        """Finish the file (fsync'd) and end every follower; returns ``exec.finished``'s ``output_log``."""
        kept = self.finish()
        self.end_followers()
        return kept

    def end_followers(self) -> None:
        for follower in self.followers:
            follower.ended = True
            follower.wake.set()

    def finish(self) -> dict[str, Any]:
        """Finish the file (fsync'd); touches no follower, so it may run in a thread."""
        self._close_frame()
        compressed = 0
        if self._compressor is not None and self._fd >= 0:
            try:
                self._pending += self._compressor.flush()
                self._write()
                os.fsync(self._fd)
                compressed = os.fstat(self._fd).st_size
            except OSError as exc:
                self._fail(exc)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        return self.summary(compressed)

    def summary(self, compressed: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.name if self.stored and self.failed is None else None,
            "stored_bytes": self.stored,
            "cut": self.cut,
            "streams": [
                {"stream": KINDS[k], "stage": s, "bytes": self.sizes[(k, s)], "sha256": d.hexdigest()}
                for (k, s), d in sorted(self.digests.items())
            ],
        }
        if out["file"] is not None:
            out["log_sha256"] = self.whole.hexdigest()
        if compressed:
            out["compressed_bytes"] = compressed
        if self.failed is not None:
            out["failed"] = self.failed
        return out

    # --- following ----------------------------------------------------------------

    def _publish(self, kind: int, stage: int, data: bytes) -> None:
        self.tail.append((kind, stage, data))
        self._tail_bytes += len(data)
        while self._tail_bytes > TAIL_BYTES and len(self.tail) > 1:
            self._tail_bytes -= len(self.tail.popleft()[2])
        for follower in self.followers:
            if follower.queued + len(data) > FOLLOW_QUEUE_BYTES:
                follower.dropped += len(data)  # a slow reader loses output, the job never waits
            else:
                follower.queue.append((kind, stage, data))
                follower.queued += len(data)
            follower.wake.set()

    def follow(self) -> _Follower:
        follower = _Follower()
        for item in self.tail:
            follower.queue.append(item)
            follower.queued += len(item[2])
        self.followers.add(follower)
        return follower


@functools.lru_cache(maxsize=64)
def worst_summary_bytes(stages: int) -> int:
    """The most `OutputLog.summary` can add to ``exec.finished`` for a job of ``stages`` stages."""
    longest = new_name(owner=group(2**32 - 1, root=True))
    worst = OutputLog(Path("/"), longest, 0, {})
    worst.cut = True
    worst.failed = "x" * 256
    worst.stored = 2**63
    for kind, stage in [(STDOUT, stages - 1)] + [(STDERR, i) for i in range(stages)]:
        worst.digests[(kind, stage)] = hashlib.sha256()
        worst.sizes[(kind, stage)] = 2**63
    summary = worst.summary(2**63) | {"file": longest}
    return len(json.dumps(summary, separators=(",", ":"))) + 32


async def next_chunks(
    log: OutputLog, follower: _Follower, wait: float
) -> tuple[list[tuple[int, int, bytes]], int, bool]:
    """What a follower has now (waiting up to ``wait`` seconds for something): chunks, bytes dropped, ended."""
    if not follower.queue and not follower.ended and not follower.dropped:
        follower.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(follower.wake.wait(), wait)
    chunks = list(follower.queue)
    follower.queue.clear()
    follower.queued = 0
    dropped, follower.dropped = follower.dropped, 0
    ended = follower.ended and not follower.queue
    if ended:
        log.followers.discard(follower)
    return chunks, dropped, ended


# --- reading back ----------------------------------------------------------------------


def read(directory: Path, name: str, limit: int) -> dict[str, Any]:
    """A stored log: its header, chunks (consecutive frames of one stream merged) and each stream's digest."""
    if not valid_name(name):
        raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "not an output log's name", {"field": "file"})
    dirfd = open_dir(directory)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dirfd)
    except FileNotFoundError:
        raise AirlockError(
            ErrorCode.NOT_FOUND, f"output log {name} is gone (pruned by runner.output_log_* retention)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AirlockError(ErrorCode.INTERNAL, f"output log {name} is a symlink; not read") from None
        raise
    finally:
        os.close(dirfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AirlockError(ErrorCode.INTERNAL, f"output log {name} is not a regular file; not read")
        raw = _decompress(fd, limit * _FRAME_GROWTH + _READ_SLACK)
    finally:
        os.close(fd)
    return parse(raw)


def _decompress(fd: int, most: int) -> tuple[bytes, bool]:
    inflater = zlib.decompressobj(31)
    out = bytearray()
    complete = False
    with os.fdopen(os.dup(fd), "rb") as handle:
        while len(out) <= most:
            chunk = handle.read(256 * 1024)
            if not chunk:
                break
            try:
                out += inflater.decompress(chunk, most + 1 - len(out))
            except zlib.error:
                break
            if inflater.eof:
                complete = True
                break
    return bytes(out[: most + 1]), complete


def parse(found: tuple[bytes, bool]) -> dict[str, Any]:
    raw, complete = found
    if not raw.startswith(MAGIC):
        raise AirlockError(ErrorCode.INTERNAL, "not an airlock output log")
    end = raw.index(b"\n", len(MAGIC)) if b"\n" in raw[len(MAGIC) :] else len(raw)
    try:
        header = json.loads(raw[len(MAGIC) : end])
    except ValueError:
        header = {}
    chunks: list[list[Any]] = []
    digests: dict[tuple[str, int], Any] = {}
    sizes: dict[tuple[str, int], int] = {}
    for kind, stage, ms, data in _frames(raw, end + 1):
        name = KINDS.get(kind, "note")
        if name != "note":
            digests.setdefault((name, stage), hashlib.sha256()).update(data)
            sizes[(name, stage)] = sizes.get((name, stage), 0) + len(data)
        if chunks and chunks[-1][0] == name and chunks[-1][1] == stage and name != "note":
            chunks[-1][3] += data
        elif len(chunks) >= MAX_CHUNKS:  # a bounded reply: the rest of each stream joins its last chunk
            same = next((c for c in reversed(chunks) if c[0] == name and c[1] == stage), None)
            if same is None:
                chunks.append([name, stage, ms, bytearray(data)])
            else:
                same[3] += data
        else:
            chunks.append([name, stage, ms, bytearray(data)])
    return {
        "header": header if isinstance(header, dict) else {},
        "complete": complete,
        "log_sha256": hashlib.sha256(raw).hexdigest(),  # the whole log as stored (`OutputLog.whole`)
        "chunks": [(n, s, ms, bytes(d)) for n, s, ms, d in chunks],
        "streams": [
            {"stream": n, "stage": s, "bytes": sizes[(n, s)], "sha256": d.hexdigest()}
            for (n, s), d in sorted(digests.items(), key=lambda kv: (kv[0][0] != "stdout", kv[0]))
        ],
    }


def _frames(raw: bytes, pos: int) -> Iterator[tuple[int, int, int, bytes]]:
    while pos + _FRAME.size <= len(raw):
        kind, stage, ms, length = _FRAME.unpack_from(raw, pos)
        pos += _FRAME.size
        if pos + length > len(raw):
            return  # a log cut short (the runner stopped mid-job)
        yield kind, stage, ms, raw[pos : pos + length]
        pos += length
