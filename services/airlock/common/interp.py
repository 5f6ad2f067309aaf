"""The interpreter chain of a root job's binary, trusted like the binary itself.

What the kernel and the loader run before the approved program's own code:
the interpreter a ``#!`` line names (and that file's own ``#!`` line or
loader, a few levels deep), an ELF's ``PT_INTERP`` (the dynamic loader), and
the directories of its ``DT_RUNPATH``/``DT_RPATH``, searched for libraries
before the system's.  For a root job each must be root's alone, walked on fds
(`airlock.common.pathtrust`); otherwise ``unsafe_binary`` names the path.
A RUNPATH directory that does not exist must sit where only root could create
it.  The checks run in the runner, on the fd it executes, just before the
job starts (runner/binaries.py), and in approval when it can read the file.

Only the start of the file is read: at most 256 bytes for a ``#!`` line
(the kernel's limit) and the ELF headers (`airlock.common.elf`).
"""

from __future__ import annotations

import os
import posixpath

from airlock.common import elf, pathtrust
from airlock.common.errors import AirlockError, ErrorCode

MAX_DEPTH = 4  # binfmt's own limit on nested interpreters is 5 (the program itself counts)
_SHEBANG_BYTES = 256


def unsafe(binary: str, path: str, why: str) -> AirlockError:
    return AirlockError(
        ErrorCode.UNSAFE_BINARY,
        f"{binary}: {path} {why}; a root job runs only code that root alone can change",
        {"path": path, "binary": binary},
    )


def check(binary: str, fd: int) -> None:
    """Refuse with ``unsafe_binary`` unless everything ``binary`` (held as the O_PATH ``fd``) loads
    before its own code is root's alone.  Raises PermissionError if the file cannot be read."""
    _check(binary, binary, fd, 0)


def _check(top: str, path: str, fd: int, depth: int) -> None:
    readable = pathtrust.reopen(fd)
    try:
        head = os.pread(readable, _SHEBANG_BYTES, 0)
        if head[:2] == b"#!":
            interpreter = _shebang(top, path, head)
            if depth >= MAX_DEPTH:
                raise unsafe(top, path, f"names an interpreter more than {MAX_DEPTH} levels deep")
            found = _trusted(top, interpreter, f"is the interpreter of {path}")
            try:
                if found.fd is not None:
                    _check(top, found.real, found.fd, depth + 1)
            finally:
                found.close()
            return
        try:
            info = elf.read_elf(lambda offset, size: os.pread(readable, size, offset))
        except elf.ElfError as exc:
            raise unsafe(top, path, f"has ELF headers that cannot be read ({exc})") from None
    finally:
        os.close(readable)
    if info is None:
        return  # neither: the kernel will refuse to execute it (ENOEXEC)
    if info.interp is not None:
        _trusted(top, info.interp, f"is the dynamic loader of {path}").close()
    for entry in (*info.runpath, *info.rpath):
        directory = _expand(top, path, entry)
        _trusted(top, directory, f"is a library directory (RUNPATH) of {path}").close()


def _shebang(top: str, path: str, head: bytes) -> str:
    line = head[2:].split(b"\n", 1)[0]
    words = line.replace(b"\t", b" ").strip().split(b" ")
    name = os.fsdecode(words[0]) if words and words[0] else ""
    if not name.startswith("/"):
        raise unsafe(top, path, f"names the interpreter {name!r}, which is not an absolute path")
    return name


def _expand(top: str, path: str, entry: str) -> str:
    origin = posixpath.dirname(path)
    text = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
    if "$" in text:
        raise unsafe(top, path, f"has a library directory {entry!r} with a token airlock does not resolve")
    if not text.startswith("/"):
        raise unsafe(top, path, f"has a relative library directory {entry!r} (relative to the job's directory)")
    return text


def _trusted(top: str, path: str, role: str) -> pathtrust.Found:
    try:
        found = pathtrust.walk(path)
    except pathtrust.WalkError as exc:
        raise unsafe(top, path, f"{role} and cannot be walked ({exc.strerror})") from None
    if found.problem is not None:
        found.close()
        where, why = found.problem
        raise unsafe(top, where, f"{why} ({path} {role})")
    return found
