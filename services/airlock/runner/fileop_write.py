"""File writes on descriptors: atomic, the old file's metadata kept, the approved pre-state held.

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
import os
import secrets
import stat
from collections.abc import Callable
from typing import Any

from airlock.common.fileop_spec import FileSpec
from airlock.runner.fileop_diff import unified_diff
from airlock.runner.fileop_walk import (
    FileOpError,
    _open_regular,
    _os_error,
    _parent,
    _read_fd,
    _require_regular,
    _sha256,
)

_RENAME_NOREPLACE = 1
_ACL = "system.posix_acl_access"
# Never carried over to new content: file capabilities grant privilege (like setuid, which is
# dropped too), and IMA/EVM values are computed from the old content and metadata.
_NOT_KEPT = frozenset({"security.capability", "security.ima", "security.evm"})
# Names a fresh temporary file may get on its own (the directory's default ACL); removed
# when the file being replaced does not have them.  An LSM label (security.selinux) stays.
_FRESH_REMOVABLE = (_ACL,)
PREVIEW_LIMIT = 4 * 1024 * 1024  # files larger than this get no diff in the approval view
ABSENT = "absent"  # the pre-state of a file that does not exist


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
