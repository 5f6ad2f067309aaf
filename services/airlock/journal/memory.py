"""The journal's memory outside the Python heap (issue 21): SQLite's own figures, and giving freed memory back.

A long-running journal's resident set grew by a few MiB over its first tens
of thousands of execs and then levelled off (docs/benchmarks-log.md, issue 21, *Memory*).
What grows is anonymous memory: the C allocator's heap, in which SQLite's
page caches, statement objects and Python's short-lived buffers (each
append's JSON, each batch's rows) come and go.  glibc keeps freed heap
memory for reuse instead of returning it, so the high-water mark of those
allocations stays resident.  Every `journal.anchor_every_records` records,
the journal logs SQLite's figures (``journal.memory.sampled``) and calls
``malloc_trim(0)``, which returns the free pages at the top and in the
middle of the heap to the kernel.

Both go through ctypes to the libraries already loaded (Python's ``_sqlite3``
links the system libsqlite3; the C library is glibc).  Either may be
missing: then the figure is None, and nothing is trimmed.
"""

from __future__ import annotations

from typing import Any

# sqlite3_status() operations (sqlite3.h).
_STATUS = {"memory_used": 0, "pagecache_overflow": 2, "malloc_size": 5, "malloc_count": 9}

_libs: dict[str, Any] = {}


def _lib(name: str) -> Any:
    if name not in _libs:
        import ctypes

        try:
            _libs[name] = ctypes.CDLL(name)
        except OSError:
            _libs[name] = None
    return _libs[name]


def sqlite_status() -> dict[str, int | None]:
    """SQLite's process-wide allocator figures (current values, bytes or counts)."""
    import ctypes

    lib = _lib("libsqlite3.so.0")
    out: dict[str, int | None] = {}
    for name, op in _STATUS.items():
        if lib is None:
            out[name] = None
            continue
        current, highest = ctypes.c_int64(), ctypes.c_int64()
        rc = lib.sqlite3_status64(op, ctypes.byref(current), ctypes.byref(highest), 0)
        out[name] = int(current.value) if rc == 0 else None
    return out


def rss_kib() -> dict[str, int]:
    """This process's resident set from /proc/self/status: VmRSS, RssAnon, RssFile (KiB)."""
    out = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


def trim() -> bool:
    """Give the C heap's free pages back to the kernel (glibc's malloc_trim(0)); False if unavailable."""
    libc = _lib("libc.so.6")
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True
