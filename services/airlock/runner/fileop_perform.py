"""File operations on file descriptors, run in a child that already is the job's identity.

The operations (`read`, `inspect`, `list_dir`, `find`, `search`, `write`,
`edit`, and `preview` for the operator's diff) are plain functions of a
`FileSpec`.  They run in `runner.fileop_child`, a process the runner execs fresh as
the target identity, so the kernel enforces that user's permissions:
permission denied, a missing file, no match are *outcomes*
(``{"ok": false, "error": {"code", "message"}}``), never a crash.

Every path is resolved once, here, on file descriptors: from an fd of ``/``,
one component at a time with ``openat(O_PATH|O_DIRECTORY|O_NOFOLLOW)``; the
last component is opened (or created) relative to its parent's fd with
``O_NOFOLLOW``.  A symlink met anywhere is ``not_canonical`` and nothing is
touched; a link swapped in after the walk cannot redirect what the held fds
name.  Only regular files are read or written (a FIFO or device is
``not_a_file``, checked with ``lstat`` before the open and ``fstat`` after,
and the open is non-blocking).  Directories are walked with
``scandir(fd)`` and ``openat`` relative to the held directory fds.

Writes are atomic: a temporary file created with ``O_EXCL`` in the parent's
fd, written and fsynced, given the old file's owner, group and permission
bits (never setuid, setgid or sticky), its ACL and its ``security.*`` and
``user.*`` extended attributes (`_keep_xattrs`: a write that cannot keep
them is refused with ``metadata_not_kept`` and nothing is written), renamed
over the target relative to the same fd, and the directory fsynced.  A new
file is created with the requested mode, so the kernel applies the
directory's default ACL (or the umask) as it does for any new file.  A reader (or a crash, or SIGKILL at
any moment) sees the old content or the new, never a mix.  When the content
the write was approved against is known (the operator reviewed it, or the
agent sent ``expected_sha256``), the held file is hashed again right before
the rename, and a file that changed, appeared or vanished is
``file_changed`` with nothing written.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import fnmatch
import grp
import hashlib
import os
import pwd
import re
import secrets
import stat
from collections.abc import Callable, Generator, Iterator
from typing import Any

from airlock.common.fileop_spec import FileSpec
from airlock.runner.fileop_diff import unified_diff

HASH_LIMIT = 256 * 1024 * 1024  # files_inspect hashes regular files up to this size
SEARCH_FILE_LIMIT = 16 * 1024 * 1024  # files_search skips larger files
SEARCH_OUTPUT_LIMIT = 4 * 1024 * 1024  # bytes of matched text one search returns at most
PREVIEW_LIMIT = 4 * 1024 * 1024  # files larger than this get no diff in the approval view
ABSENT = "absent"  # the pre-state of a file that does not exist

_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_RENAME_NOREPLACE = 1
_ACL = "system.posix_acl_access"
# Never carried over to new content: file capabilities grant privilege (like setuid, which is
# dropped too), and IMA/EVM values are computed from the old content and metadata.
_NOT_KEPT = frozenset({"security.capability", "security.ima", "security.evm"})
# Names a fresh temporary file may get on its own (the directory's default ACL); removed
# when the file being replaced does not have them.  An LSM label (security.selinux) stays.
_FRESH_REMOVABLE = (_ACL,)


class FileOpError(Exception):
    """An operation that ran and failed: reported as the outcome's error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_ERRNO_CODES = {
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.ENOENT: "not_found",
    errno.EISDIR: "is_a_directory",
    errno.ENOTDIR: "not_a_directory",
    errno.ELOOP: "not_canonical",  # O_NOFOLLOW met a symlink
    errno.ENXIO: "not_a_file",
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EFBIG: "too_large",
}


def _os_error(exc: OSError, path: str) -> FileOpError:
    code = _ERRNO_CODES.get(exc.errno or 0, "io_error")
    return FileOpError(code, f"{path}: {exc.strerror or exc}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "other"


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


# --- resolution on file descriptors ----------------------------------------------------------


def _components(path: str) -> list[str]:
    if path == "/":
        return []
    parts = path.split("/")[1:]
    if not path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise FileOpError("not_canonical", f"{path}: not a normalised absolute path")
    return parts


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _refusal(exc: OSError, dir_fd: int, name: str, path: str) -> FileOpError:
    """The outcome of a failed ``openat``: a symlink in the way is ``not_canonical``."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO) and _is_link(dir_fd, name):
        return FileOpError("not_canonical", f"{path} is a symbolic link; ask for the resolved path")
    return _os_error(exc, path)


def _openat(dir_fd: int, name: str, flags: int, path: str, mode: int = 0o777) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(exc, dir_fd, name, path) from None


def _hold(stack: contextlib.ExitStack, fd: int) -> int:
    stack.callback(os.close, fd)
    return fd


def _parent(path: str, stack: contextlib.ExitStack) -> tuple[int, str]:
    """(an O_PATH fd of the path's directory, the last name), with no symlink followed.

    Walked from ``/`` one component at a time; each step is relative to the
    fd of the one before, so a rename or a link swapped in later cannot change
    where the walk went.  ``/`` itself is ``(fd of /, ".")``.
    """
    parts = _components(path)
    fd = os.open("/", _PATH_DIR)
    walked = ""
    try:
        for name in parts[:-1]:
            walked = _join(walked, name)
            following = _openat(fd, name, _PATH_DIR, walked)
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return _hold(stack, fd), (parts[-1] if parts else ".")


def _lstat(dir_fd: int, name: str, path: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise _os_error(exc, path) from None


def _require_regular(st: os.stat_result, path: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise FileOpError("is_a_directory", f"{path}: is a directory")
    if stat.S_ISLNK(st.st_mode):
        raise FileOpError("not_canonical", f"{path} is a symbolic link; ask for the resolved path")
    raise FileOpError("not_a_file", f"{path}: not a regular file (a {_kind(st.st_mode)})")


def _open_regular(dir_fd: int, name: str, path: str, stack: contextlib.ExitStack) -> tuple[int, os.stat_result]:
    """A held read fd of a regular file (never a FIFO, device or symlink) and its fstat."""
    _require_regular(_lstat(dir_fd, name, path), path)
    fd = _hold(stack, _openat(dir_fd, name, _READ_FILE, path))
    st = os.fstat(fd)
    _require_regular(st, path)  # it may have been swapped between lstat and open
    return fd, st


def _open_dir(dir_fd: int, name: str, path: str, stack: contextlib.ExitStack) -> int:
    st = _lstat(dir_fd, name, path)
    if stat.S_ISLNK(st.st_mode):
        raise FileOpError("not_canonical", f"{path} is a symbolic link; ask for the resolved path")
    if not stat.S_ISDIR(st.st_mode):
        raise FileOpError("not_a_directory", f"{path}: not a directory")
    return _hold(stack, _openat(dir_fd, name, _READ_DIR, path))


def _read_fd(fd: int, limit: int | None = None, path: str = "") -> bytes:
    size = os.fstat(fd).st_size
    if limit is not None and size > limit:
        raise FileOpError("too_large", f"{path}: {size} bytes is more than {limit}")
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1024 * 1024, offset):
        chunks.append(chunk)
        offset += len(chunk)
        if limit is not None and offset > limit:
            raise FileOpError("too_large", f"{path}: more than {limit} bytes")
    return b"".join(chunks)


# --- read-only tools ------------------------------------------------------------------


def read(spec: FileSpec) -> dict[str, Any]:
    offset, length = spec.params["offset_bytes"], spec.params["length_bytes"]
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        fd, st = _open_regular(parent, name, spec.path, stack)
        data = os.pread(fd, length, offset) if offset < st.st_size else b""
    end = offset + len(data)
    eof = end >= st.st_size
    return {
        "content": base64.b64encode(data).decode("ascii"),
        "content_sha256": _sha256(data),
        "offset_bytes": offset,
        "length_bytes": len(data),
        "size_bytes": st.st_size,
        "next_offset_bytes": None if eof else end,
        "eof": eof,
    }


def _names(uid: int, gid: int) -> tuple[str | None, str | None]:
    try:
        owner: str | None = pwd.getpwuid(uid).pw_name
    except KeyError:
        owner = None
    try:
        group: str | None = grp.getgrgid(gid).gr_name
    except KeyError:
        group = None
    return owner, group


def inspect(spec: FileSpec) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        st = _lstat(parent, name, spec.path)
        owner, group = _names(st.st_uid, st.st_gid)
        out: dict[str, Any] = {
            "type": _kind(st.st_mode),
            "size_bytes": st.st_size,
            "mode": f"{stat.S_IMODE(st.st_mode):04o}",
            "owner_uid": st.st_uid,
            "owner_gid": st.st_gid,
            "owner": owner,
            "group": group,
            "mtime": st.st_mtime,
            "sha256": None,
        }
        if stat.S_ISLNK(st.st_mode):
            out["link_target"] = os.readlink(name, dir_fd=parent)
        elif stat.S_ISREG(st.st_mode) and st.st_size <= HASH_LIMIT:
            try:
                fd, held = _open_regular(parent, name, spec.path, stack)
                if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino):
                    out["sha256"] = _sha256(_read_fd(fd, HASH_LIMIT, spec.path))
            except (OSError, FileOpError):
                pass  # metadata is still the answer; the hash needs read permission
    return out


def _listing(dir_fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(dir_fd) as it:  # scandir duplicates the fd; ours stays open
        return sorted(it, key=lambda e: e.name)


def list_dir(spec: FileSpec) -> dict[str, Any]:
    limit = spec.params["limit"]
    entries: list[dict[str, Any]] = []
    truncated = False
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        dir_fd = _open_dir(parent, name, spec.path, stack)
        for entry in _listing(dir_fd):
            if len(entries) >= limit:
                truncated = True
                break
            try:
                st = entry.stat(follow_symlinks=False)
                kind, size = _kind(st.st_mode), st.st_size
            except OSError:
                kind, size = "unknown", None
            entries.append({"name": entry.name, "type": kind, "size_bytes": size})
    return {"entries": entries, "truncated": truncated}


def _walk(
    dir_fd: int, path: str, depth: int, max_depth: int
) -> Generator[tuple[int, str, os.DirEntry[str]], None, None]:
    """(directory fd, directory path, entry) below a held directory, not following symlinks.

    Entries of a directory in name order, then its subdirectories, depth
    first, up to ``max_depth``.  A subdirectory is entered with
    ``openat(O_NOFOLLOW|O_DIRECTORY)`` relative to its parent's fd: one
    swapped for a symlink meanwhile is skipped, never followed.
    """
    try:
        entries = _listing(dir_fd)
    except OSError:
        return  # an unreadable subdirectory is skipped, as find(1) reports and goes on
    for entry in entries:
        yield dir_fd, path, entry
    if depth >= max_depth:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            sub = os.open(entry.name, _READ_DIR, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            yield from _walk(sub, _join(path, entry.name), depth + 1, max_depth)
        finally:
            os.close(sub)


def find(spec: FileSpec) -> dict[str, Any]:
    pattern, limit = spec.params["pattern"], spec.params["limit"]
    paths: list[str] = []
    truncated = False
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        dir_fd = _open_dir(parent, name, spec.path, stack)
        walk = stack.enter_context(contextlib.closing(_walk(dir_fd, spec.path, 1, spec.params["max_depth"])))
        for _fd, directory, entry in walk:
            if fnmatch.fnmatchcase(entry.name, pattern):
                if len(paths) >= limit:
                    truncated = True
                    break
                paths.append(_join(directory, entry.name))
    return {"paths": paths, "truncated": truncated}


def search(spec: FileSpec) -> dict[str, Any]:
    query, limit = spec.params["query"], spec.params["limit"]
    try:
        matcher: Callable[[str], bool] = (
            re.compile(query).search if spec.params["regex"] else (lambda line: query in line)  # type: ignore[assignment]
        )
    except re.error as exc:
        raise FileOpError("invalid_pattern", f"query: not a valid regular expression ({exc})") from None
    matches: list[dict[str, Any]] = []
    scanned = 0
    returned = 0
    truncated = False
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        st = _lstat(parent, name, spec.path)
        files: Iterator[tuple[int, str, str]]  # (directory fd, name, path)
        if stat.S_ISDIR(st.st_mode):
            dir_fd = _open_dir(parent, name, spec.path, stack)
            walk = stack.enter_context(contextlib.closing(_walk(dir_fd, spec.path, 1, spec.params["max_depth"])))
            files = (
                (fd, e.name, _join(d, e.name))
                for fd, d, e in walk
                if e.is_file(follow_symlinks=False) and fnmatch.fnmatchcase(e.name, spec.params["glob"])
            )
        else:
            _require_regular(st, spec.path)
            files = iter([(parent, name, spec.path)])
        for dir_fd, entry_name, path in files:
            try:
                with contextlib.ExitStack() as one:
                    fd, _st = _open_regular(dir_fd, entry_name, path, one)
                    data = _read_fd(fd, SEARCH_FILE_LIMIT, path)
            except (OSError, FileOpError):
                if path == spec.path:
                    raise
                continue
            if b"\0" in data[:8192]:
                continue  # binary
            scanned += 1
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
                if matcher(line):
                    text = line[:1000]
                    if len(matches) >= limit or returned + len(text) > SEARCH_OUTPUT_LIMIT:
                        truncated = True
                        break
                    returned += len(text)
                    matches.append({"path": path, "line": number, "text": text})
            if truncated:
                break
    return {"matches": matches, "files_scanned": scanned, "truncated": truncated}


# --- writes -------------------------------------------------------------------------------


def _current(
    parent: int, name: str, path: str, stack: contextlib.ExitStack
) -> tuple[int, bytes, os.stat_result] | None:
    """The existing file as a held fd, its content and fstat; None if there is none."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _os_error(exc, path) from None
    _require_regular(st, path)
    fd, held = _open_regular(parent, name, path, stack)
    return fd, _read_fd(fd), held


def _renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _rename_new(parent: int, temp: str, name: str, path: str) -> None:
    """Rename ``temp`` to ``name`` only if nothing is there (RENAME_NOREPLACE)."""
    try:
        _renameat2(parent, temp, parent, name, _RENAME_NOREPLACE)
        return
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise FileOpError(
                "file_changed", f"{path}: was approved as absent but exists now; nothing was written"
            ) from None
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
    except AttributeError:
        pass  # a C library without renameat2
    if _is_present(parent, name):
        raise FileOpError("file_changed", f"{path}: was approved as absent but exists now; nothing was written")
    os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)


def _is_present(parent: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _still(parent: int, name: str, path: str, held: tuple[int, bytes, os.stat_result] | None, expect: str) -> None:
    """Refuse with ``file_changed`` unless the target is still what ``expect`` names."""
    if held is None:
        if expect != ABSENT:
            raise FileOpError(
                "file_changed", f"{path}: does not exist, but was approved with content {expect}; nothing was written"
            )
        return  # checked atomically by the rename (RENAME_NOREPLACE)
    fd, _before, st = held
    if expect == ABSENT:
        raise FileOpError("file_changed", f"{path}: exists, but was approved as absent; nothing was written")
    try:
        now = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise FileOpError("file_changed", f"{path}: was replaced since it was read; nothing was written")
    current = _sha256(_read_fd(fd))
    if current != expect:
        raise FileOpError(
            "file_changed", f"{path}: its content is {current}, not the approved {expect}; nothing was written"
        )


def _xattr_names(fd: int, path: str) -> list[str]:
    try:
        return sorted(os.listxattr(fd))
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return []  # a filesystem without extended attributes: nothing to keep
        raise _os_error(exc, path) from None


def _xattrs(fd: int, path: str) -> dict[str, bytes]:
    """The extended attributes a replacement must keep (ACL, ``security.*``, ``user.*``, others seen)."""
    out: dict[str, bytes] = {}
    for name in _xattr_names(fd, path):
        if name in _NOT_KEPT:
            continue
        try:
            out[name] = os.getxattr(fd, name)
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                continue  # removed meanwhile
            raise FileOpError(
                "metadata_not_kept", f"{path}: cannot read its attribute {name} ({exc.strerror})"
            ) from None
    return out


def _keep_xattrs(fd: int, wanted: dict[str, bytes], path: str) -> None:
    """Give the temporary file ``fd`` exactly the kept attributes of the file it replaces.

    Before the final ``fchmod``: setting the ACL sets the group bits to its
    mask, and the ``fchmod`` with the old mode then leaves both as they were.
    A filesystem (or LSM) that refuses one is ``metadata_not_kept``: a write
    that would silently drop what protects the file is not made.
    """
    for name in _FRESH_REMOVABLE:
        if name not in wanted:
            with contextlib.suppress(OSError):
                os.removexattr(fd, name)  # inherited from the directory's default ACL
    for name, value in wanted.items():
        try:
            if _getxattr(fd, name) != value:
                os.setxattr(fd, name, value)
        except OSError as exc:
            raise FileOpError(
                "metadata_not_kept",
                f"{path}: cannot keep its attribute {name} ({exc.strerror}); nothing was written",
            ) from None


def _getxattr(fd: int, name: str) -> bytes | None:
    try:
        return os.getxattr(fd, name)
    except OSError:
        return None


def _check_kept(fd: int, wanted: dict[str, bytes], mode: int, path: str) -> None:
    """After the last change of the temporary file: it has the old mode and attributes, or nothing is written."""
    now = stat.S_IMODE(os.fstat(fd).st_mode)
    if now != mode:
        raise FileOpError(
            "metadata_not_kept", f"{path}: its mode {mode:04o} came out as {now:04o}; nothing was written"
        )
    for name, value in wanted.items():
        if _getxattr(fd, name) != value:
            raise FileOpError("metadata_not_kept", f"{path}: its attribute {name} was not kept; nothing was written")
    for name in _FRESH_REMOVABLE:
        if name not in wanted and _getxattr(fd, name) is not None:
            # An inherited default ACL the old file did not have could widen who may read it.
            raise FileOpError(
                "metadata_not_kept", f"{path}: the new file would get an ACL it did not have; nothing was written"
            )


def atomic_write(
    parent: int,
    name: str,
    path: str,
    data: bytes,
    existing: os.stat_result | None,
    mode: int | None,
    *,
    before_rename: Callable[[], None] | None = None,
    replace: bool = True,
    existing_fd: int | None = None,
) -> None:
    """Replace ``name`` in the held directory ``parent`` with ``data``.

    Temp file (``O_EXCL``, same directory), fsync, owner, group, permission
    bits (setuid, setgid and sticky never), ACL and extended attributes of
    the held ``existing_fd`` kept, ``before_rename`` (the pre-state check),
    rename, fsync of the directory.  ``replace=False`` renames only if
    nothing is there.  A new file (``existing`` None) is created with
    ``mode``: the kernel applies the directory's default ACL or the umask.
    """
    stem = os.fsdecode(os.fsencode(name)[:200])  # NAME_MAX is 255 bytes, not characters
    temp = f".{stem}.airlock-{secrets.token_hex(6)}.tmp"
    # Read before anything is created: a write that cannot see what it must keep is not made.
    kept = _xattrs(existing_fd, path) if existing is not None and existing_fd is not None else {}
    create_mode = 0o600 if existing is not None else (mode if mode is not None else 0o644) & 0o777
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, create_mode, dir_fd=parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if existing is not None:
                if (existing.st_uid, existing.st_gid) != (os.geteuid(), os.getegid()):
                    try:
                        os.fchown(fd, existing.st_uid, existing.st_gid)
                    except PermissionError:
                        raise FileOpError(
                            "permission_denied",
                            f"{path}: cannot keep its owner {existing.st_uid}:{existing.st_gid} (only root can); "
                            "nothing was written",
                        ) from None
                keep_mode = stat.S_IMODE(existing.st_mode) & 0o777
                _keep_xattrs(fd, kept, path)
                os.fchmod(fd, keep_mode)
                _check_kept(fd, kept, keep_mode, path)
            os.fsync(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename()
        if replace:
            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        else:
            _rename_new(parent, temp, name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise
    try:
        dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return  # a directory we may write but not read: its entry is durable at the next sync
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _new_content(spec: FileSpec, before: bytes | None) -> bytes:
    if spec.tool == "files_write":
        return base64.b64decode(spec.params["content"])
    if before is None:
        raise FileOpError("not_found", f"{spec.path}: no such file")
    try:
        text = before.decode("utf-8")
    except UnicodeDecodeError:
        raise FileOpError("not_text", f"{spec.path}: not UTF-8 text; use files_write") from None
    old, new = spec.params["old_text"], spec.params["new_text"]
    count = text.count(old)
    if count == 0:
        raise FileOpError("no_match", f"{spec.path}: old_text was not found")
    if count > 1:
        raise FileOpError("ambiguous_match", f"{spec.path}: old_text matches {count} times; it must match exactly once")
    return text.replace(old, new, 1).encode("utf-8")


def _expectations(spec: FileSpec, expect: str | None) -> list[str]:
    """The pre-states this write must find: the agent's ``expected_sha256``, the reviewed one."""
    wanted = [e for e in (spec.params.get("expected_sha256"), expect) if e is not None]
    return wanted


def _check_preconditions(spec: FileSpec, before: bytes | None, wanted: list[str]) -> None:
    state = ABSENT if before is None else _sha256(before)
    for expected in wanted:
        if state != expected:
            raise FileOpError(
                "file_changed",
                f"{spec.path}: the current content ({state}) is not the expected {expected}; nothing was written",
            )
    if spec.tool == "files_write" and before is None and not spec.params["create"]:
        raise FileOpError("not_found", f"{spec.path}: no such file (create is false)")


def write(spec: FileSpec, expect: str | None = None) -> dict[str, Any]:
    wanted = _expectations(spec, expect)
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        held = _current(parent, name, spec.path, stack)
        before = None if held is None else held[1]
        _check_preconditions(spec, before, wanted)
        after = _new_content(spec, before)

        def recheck() -> None:
            for expected in wanted:
                _still(parent, name, spec.path, held, expected)

        atomic_write(
            parent,
            name,
            spec.path,
            after,
            None if held is None else held[2],
            spec.params.get("mode"),
            before_rename=recheck if wanted else None,
            replace=held is not None or not wanted,
            existing_fd=None if held is None else held[0],
        )
    out = {
        "before_sha256": None if before is None else _sha256(before),
        "after_sha256": _sha256(after),
        "size_bytes": len(after),
        "created": before is None,
    }
    if spec.tool == "files_edit":
        out["diff"] = unified_diff(spec.path, before, after)
    return out


def preview(spec: FileSpec) -> dict[str, Any]:
    """For the approval view: the diff a write or edit would make now (nothing is written).

    ``before_sha256`` is what approval binds to the ticket: the runner writes
    only if the file still has it (null: the file must still be absent).
    """
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            _require_regular(st, spec.path)
            if st.st_size > PREVIEW_LIMIT:
                raise FileOpError("too_large", f"{spec.path}: too large for a diff ({st.st_size} bytes)")
        held = _current(parent, name, spec.path, stack)
        before = None if held is None else held[1]
        _check_preconditions(spec, before, _expectations(spec, None))
        after = _new_content(spec, before)
    return {
        "before_sha256": None if before is None else _sha256(before),
        "after_sha256": _sha256(after),
        "diff": unified_diff(spec.path, before, after),
    }


OPERATIONS: dict[str, Callable[[FileSpec], dict[str, Any]]] = {
    "files_read": read,
    "files_inspect": inspect,
    "files_list": list_dir,
    "files_find": find,
    "files_search": search,
    "files_write": write,
    "files_edit": write,
}


def perform(spec: FileSpec, *, preview_only: bool = False, expect: str | None = None) -> dict[str, Any]:
    """Run one operation with this process's rights; errors become the outcome.

    ``expect`` is the pre-state bound to the ticket ("absent" or a sha256):
    a write proceeds only if the file still has it.
    """
    try:
        if preview_only:
            result = preview(spec)
        elif spec.writes:
            result = write(spec, expect)
        else:
            result = OPERATIONS[spec.tool](spec)
    except FileOpError as exc:
        return {"ok": False, "error": {"code": exc.code, "message": exc.message}}
    except OSError as exc:
        err = _os_error(exc, spec.path)
        return {"ok": False, "error": {"code": err.code, "message": err.message}}
    return {"ok": True, "error": None} | result
