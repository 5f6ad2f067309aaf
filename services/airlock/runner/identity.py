"""Who a job runs as, with which environment, in which directory.

Everything here is derived from the target user's passwd entry and the
request, never from the daemon: a job must not inherit the runner's
environment (NOTIFY_SOCKET, LISTEN_*, ...) or its view of the filesystem
(the runner is root; the job usually is not).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass

from airlock.common import envrule
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import default_path

# Variables that belong to the service manager's conversation with the daemon.
# A request may not set them either: a job that can talk to NOTIFY_SOCKET or
# believes it was socket-activated could confuse systemd about the runner.
_RESERVED_NAMES = frozenset({"NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC"})
_RESERVED_PREFIXES = ("LISTEN_",)

_MAX_SYMLINKS = 40  # the kernel's limit for one path lookup


@dataclass(frozen=True, slots=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, the primary gid included
    user: str
    home: str
    shell: str = "/bin/sh"

    def __post_init__(self) -> None:
        if self.uid < 0 or self.gid < 0 or any(g < 0 for g in self.groups):
            raise ValueError(f"identity ids must not be negative (got uid {self.uid}, gid {self.gid})")


# Identities resolved lately (issue 21: a passwd and a group lookup per exec
# were a tenth of the runner's CPU).  An entry is used for at most
# IDENTITY_TTL_SECONDS, and only while /etc/passwd and /etc/group are the same
# files as when it was resolved (device, inode, size, mtime): an edit there
# (useradd, usermod -G, gpasswd -d) takes effect at the next exec.  Sources
# other than those files (sssd, LDAP) take effect within the TTL.
IDENTITY_TTL_SECONDS = 5.0
_DATABASES = ("/etc/passwd", "/etc/group")
_cache: dict[int, tuple[float, tuple[tuple[int, int, int, int], ...], Identity]] = {}


def _databases() -> tuple[tuple[int, int, int, int], ...]:
    out = []
    for path in _DATABASES:
        try:
            st = os.stat(path)
        except OSError:
            return ()  # cannot tell: do not cache
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def resolve_identity(uid: int) -> Identity:
    """The identity of ``uid`` from the passwd and group databases (cached briefly; see IDENTITY_TTL_SECONDS)."""
    now = time.monotonic()
    files = _databases()
    hit = _cache.get(uid)
    if hit is not None and files and hit[1] == files and now - hit[0] < IDENTITY_TTL_SECONDS:
        return hit[2]
    identity = _lookup_identity(uid)
    if files:
        if len(_cache) >= 1024:
            _cache.clear()
        _cache[uid] = (now, files, identity)
    return identity


def _lookup_identity(uid: int) -> Identity:
    try:
        entry = pwd.getpwuid(uid)
    except (KeyError, OverflowError, ValueError):
        raise AirlockError(ErrorCode.INVALID_ARGUMENTS, f"no user with uid {uid}", {"uid": uid}) from None
    groups = sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid)) | {entry.pw_gid})
    return Identity(
        uid=uid,
        gid=entry.pw_gid,
        groups=tuple(groups),
        user=entry.pw_name,
        home=entry.pw_dir,
        shell=entry.pw_shell or "/bin/sh",
    )


def encodable(text: str) -> bool:
    """Whether ``text`` becomes bytes for the OS (JSON may carry lone surrogates)."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


def _check_env_name(name: str) -> None:
    if not name or "=" in name or "\0" in name or not encodable(name):
        raise AirlockError(ErrorCode.INVALID_ARGUMENTS, f"invalid environment variable name {name!r}")
    if name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIXES):
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS,
            f"environment variable {name} is reserved for the service manager",
            {"name": name},
        )


def build_env(
    identity: Identity,
    request_env: Mapping[str, str],
    protected_env: Mapping[str, str],
    *,
    strict: bool | None = None,
) -> dict[str, str]:
    """A job's environment, built from scratch.

    HOME, USER, LOGNAME, SHELL and PATH come from the target user's passwd
    entry and the fixed path for that user; then the request's variables;
    then the protected ones, which override both.  For a root job the
    request may not set those five, nor a variable that changes what a
    program loads or runs (envrule.py): refused, never dropped; so for a
    privileged job as another account (``strict``, issue 48).  Nothing of
    the daemon's own environment is consulted.
    """
    strict = identity.uid == 0 if strict is None else strict
    env = {
        "HOME": identity.home,
        "USER": identity.user,
        "LOGNAME": identity.user,
        "SHELL": identity.shell,
        "PATH": default_path(identity.uid),
    }
    for source in (request_env, protected_env):
        for name, value in source.items():
            _check_env_name(name)
            refused = envrule.refusal(name, value) if strict else None
            if refused is not None:
                raise AirlockError(ErrorCode.INVALID_ARGUMENTS, f"env.{name}: {refused}", {"field": f"env.{name}"})
            if "\0" in value or not encodable(value):
                raise AirlockError(
                    ErrorCode.INVALID_ARGUMENTS, f"environment variable {name}: value has a NUL or lone surrogate"
                )
            env[name] = value
    return env


def default_cwd(identity: Identity) -> str:
    """Where a job without a ``cwd`` starts: ``/`` for root, else the home if it exists."""
    if identity.uid == 0 or not os.path.isdir(identity.home):
        # Like login(1): a user whose home is missing (nobody's /nonexistent) starts in /.
        return "/"
    return identity.home


def _permitted(identity: Identity, st: os.stat_result, owner: int, group: int, other: int) -> bool:
    """Whether the mode bit that applies to ``identity`` (owner, else group, else other) is set."""
    if st.st_uid == identity.uid:
        return bool(st.st_mode & owner)
    if st.st_gid == identity.gid or st.st_gid in identity.groups:
        return bool(st.st_mode & group)
    return bool(st.st_mode & other)


def _may_search(identity: Identity, st: os.stat_result) -> bool:
    # Root searches any directory (CAP_DAC_READ_SEARCH).
    return identity.uid == 0 or _permitted(identity, st, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)


class _Refused(Exception):
    """Why a path is out of the target user's reach (internal)."""


@dataclass(frozen=True, slots=True)
class HeldDir:
    """A directory the runner walked to on fds and holds open (``O_PATH``): what a job enters, by fd."""

    fd: int
    st: os.stat_result
    real: str  # the path walked, symlinks resolved (for messages)

    def close(self) -> None:
        os.close(self.fd)


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_ANY_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def _enter(identity: Identity, path: str, root: str = "/") -> HeldDir:
    """Walk ``path`` as the kernel would for ``identity``, down to a directory it may enter; hold it.

    Every directory looked up in, symlinks followed, needs the search bit
    that applies to the user's uid, gid or supplementary groups.  The walk is
    on fds (``openat`` with ``O_NOFOLLOW``, a symlink read where it sits and
    followed by hand), so the directory returned is the one whose ``fstat``
    was checked, whatever is renamed meanwhile.  ``root``: where ``/`` is
    (runner/arguments.py ``view``).
    """
    pending = [c for c in path.split("/") if c]
    pending.reverse()  # a stack: the next component is last
    try:
        stack = [(os.open(root, _DIR_FLAGS), "/")]
    except OSError as exc:
        raise _Refused(f"{root} cannot be examined ({os.strerror(exc.errno or 0)})") from None
    links = 0
    try:
        while True:
            fd, current = stack[-1]
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                raise _Refused(f"{current} is not a directory")
            if not _may_search(identity, st):
                raise _Refused(f"no permission to enter {current}")
            if not pending:
                stack.pop()
                return HeldDir(fd, st, current)
            component = pending.pop()
            if component == ".":
                continue
            if component == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            candidate = os.path.join(current, component)
            try:
                opened = os.open(component, _ANY_FLAGS, dir_fd=fd)
            except OSError as exc:
                why = "does not exist" if exc.errno == errno.ENOENT else os.strerror(exc.errno or 0)
                raise _Refused(f"{candidate} {why}") from None
            if stat.S_ISLNK(os.fstat(opened).st_mode):
                try:
                    target = os.readlink("", dir_fd=opened)  # the link opened, not its name again
                finally:
                    os.close(opened)
                links += 1
                if links > _MAX_SYMLINKS:
                    raise _Refused("too many levels of symbolic links")
                pending.extend(reversed([c for c in target.split("/") if c]))
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                continue
            stack.append((opened, candidate))
    finally:
        for fd, _current in stack:
            os.close(fd)


def _for(identity: Identity) -> str:
    return f"for user {identity.user} (uid {identity.uid})"


def check_cwd(identity: Identity, cwd: str) -> None:
    """Refuse unless ``identity`` could ``chdir(cwd)``.

    The runner changes directory while still root (subprocess does chdir
    before setuid), so the kernel never checks this for us.  Mode bits only:
    POSIX ACLs are not evaluated.
    """
    open_cwd(identity, cwd).close()


def open_cwd(identity: Identity, cwd: str, root: str = "/") -> HeldDir:
    """`check_cwd`, and hold the directory checked: the job enters this fd, never ``cwd`` by name again.

    ``root``: where ``/`` is for the job (runner/arguments.py ``view``).
    """
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd or not encodable(cwd):
        raise AirlockError(ErrorCode.INVALID_ARGUMENTS, f"working directory must be an absolute path (got {cwd!r})")
    try:
        return _enter(identity, cwd, root)
    except _Refused as refused:
        raise AirlockError(
            ErrorCode.SPAWN_FAILED,
            f"working directory {cwd}: {refused} {_for(identity)}",
            {"cwd": cwd, "uid": identity.uid},
        ) from None


def check_executable(identity: Identity, path: str, held: os.stat_result | None = None) -> None:
    """Refuse unless ``identity`` may execute the canonical binary ``path``.

    Checked before any stage starts, so that a pipeline whose later stage
    could not exec does not run its earlier ones.  Mode bits only; an
    interpreter named by a ``#!`` line is left to the kernel.  ``held``: the
    ``fstat`` of the file the runner holds open (and will execute); the
    directories are walked by name only to judge the user's search rights.
    """
    try:
        _enter(identity, os.path.dirname(path) or "/").close()
        st = held if held is not None else os.stat(path)
    except _Refused as refused:
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"{path}: {refused} {_for(identity)}") from None
    except OSError as exc:
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"{path}: {os.strerror(exc.errno or 0)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"{path}: not a regular file")
    executable_bits = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    if identity.uid == 0:
        allowed = bool(st.st_mode & executable_bits)  # root still needs one x bit
    else:
        allowed = _permitted(identity, st, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)
    if not allowed:
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"{path}: no permission to execute {_for(identity)}")
