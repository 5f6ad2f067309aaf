"""Each stage's binary, opened and checked once before anything starts, then
held by fd and executed through it (never by path again).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from airlock.common import binary, interp
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import default_path, resolve_executable
from airlock.runner.identity import Identity, check_executable
from airlock.runner.jobspec import JobSpec


def _is_own_identity(identity: Identity) -> bool:
    own_groups = set(os.getgroups()) | {os.getegid()}
    return (
        identity.uid == os.geteuid() == os.getuid()
        and identity.gid == os.getegid() == os.getgid()
        and set(identity.groups) | {identity.gid} == own_groups
    )


@dataclass(frozen=True, slots=True)
class _Binary:
    """One stage's binary, held open: its canonical path (the argv[0] the job
    sees) and the O_PATH fd that is executed (``/proc/self/fd/N``)."""

    path: str
    fd: int
    st: os.stat_result


def _stage_error(exc: AirlockError, index: int, argv0: str) -> AirlockError:
    return AirlockError(exc.code, f"stage {index + 1}: {exc.message}", exc.details | {"stage": index, "argv0": argv0})


def _open_all(spec: JobSpec) -> list[_Binary]:
    """Open every stage's binary and check it, before anything starts.

    With bound identities (the runner service) the path is approval's and the
    open file must be the file approval saw: same device and inode, and for a
    root job the same owner and mode, and root's alone (``unsafe_binary``), and
    so is its interpreter chain (`airlock.common.interp`).  A
    bare name is never looked up on the request's PATH.
    """
    trusted = spec.trusted
    opened: list[_Binary] = []
    try:
        for index, argv in enumerate(spec.stages):
            if spec.binaries is not None:
                expected = spec.binaries[index]
                path: str | None = str(expected.get("path", ""))
            else:
                expected = None
                path = resolve_executable(argv[0], default_path(spec.identity.uid))
            if path is None:
                raise AirlockError(
                    ErrorCode.SPAWN_FAILED,
                    f"stage {index + 1}: {argv[0]}: command not found",
                    {"stage": index, "argv0": argv[0]},
                )
            try:
                fd, st = binary.open_binary(path, trusted=trusted)
                opened.append(_Binary(path, fd, st))
                if expected is not None:
                    differs = binary.mismatch(expected, binary.identity_of(path, st, privileged=trusted))
                    if differs:
                        raise AirlockError(
                            ErrorCode.BINARY_CHANGED,
                            f"{path} is not the file that was approved (changed: {', '.join(differs)})",
                            {"path": path, "changed": differs},
                        )
                check_executable(spec.identity, path, st)
                if trusted:
                    # What runs before the binary's own code (#! interpreter, loader, RUNPATH) is root's alone too.
                    try:
                        interp.check(path, fd)
                    except OSError as exc:  # fail closed: a chain we cannot read is not one we trust
                        why = f"cannot be read to check its interpreter ({exc.strerror})"
                        raise interp.unsafe(path, path, why) from None
            except AirlockError as exc:
                raise _stage_error(exc, index, argv[0]) from None
    except BaseException:
        _close_all(opened)
        raise
    return opened


def _close_all(opened: Sequence[_Binary]) -> None:
    for item in opened:
        with contextlib.suppress(OSError):
            os.close(item.fd)
