"""How argv[0] becomes the binary that runs: one function for policy and runner.

Policy matches the canonical path of the binary that the runner will execute,
and the runner executes exactly that path, so a rule for ``/usr/bin/apt-get``
cannot be side-stepped with a symlink, a relative name or a PATH trick.
"""

from __future__ import annotations

import os

# Debian's ENV_SUPATH / ENV_PATH from /etc/login.defs.
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


def default_path(uid: int) -> str:
    """The PATH a job of this uid gets (the target user's, never the client's)."""
    return ROOT_PATH if uid == 0 else USER_PATH


def first_on_path(name: str, search_path: str) -> str | None:
    """The path execvp would pick, before symlinks are resolved (the one PATH lookup).

    A name containing ``/`` is taken as a path if it exists (relative names are
    refused: the job's working directory is not the caller's); a bare name is
    the first executable file of that name in ``search_path``'s absolute
    directories.
    """
    if not name or "\0" in name:
        return None
    if "/" in name:
        return name if name.startswith("/") and os.path.lexists(name) else None
    for directory in search_path.split(":"):
        candidate = os.path.join(directory, name)
        if directory.startswith("/") and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def resolve_executable(name: str, search_path: str) -> str | None:
    """The canonical absolute path ``name`` runs as, or None if there is none.

    `first_on_path`, then symlinks resolved; the result must be an executable file.
    """
    found = first_on_path(name, search_path)
    real = canonical(found) if found is not None else None
    if real is not None and os.path.isfile(real) and os.access(real, os.X_OK):
        return real
    return None


def canonical(path: str) -> str | None:
    """``os.path.realpath``, or None when the path changes under it (or is not a path).

    A symlink replaced by a file between realpath's lstat and readlink makes
    readlink fail; a path racing like that is refused by the callers, never
    an internal error.  Two more tries cover an innocent rename.
    """
    for _ in range(3):
        try:
            return os.path.realpath(path)
        except (OSError, ValueError):
            continue
    return None
