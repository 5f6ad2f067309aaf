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


def resolve_executable(name: str, search_path: str) -> str | None:
    """The canonical absolute path ``name`` runs as, or None if there is none.

    A name containing ``/`` is taken as a path (relative names are refused:
    the job's working directory is not the caller's); a bare name is looked up
    in ``search_path`` like execvp does.  Symlinks are resolved.
    """
    if not name or "\0" in name:
        return None
    if "/" in name:
        if not name.startswith("/"):
            return None
        candidates = [name]
    else:
        candidates = [os.path.join(d, name) for d in search_path.split(":") if d.startswith("/")]
    for candidate in candidates:
        try:
            real = os.path.realpath(candidate)
        except OSError:
            continue  # a link flipped while it was resolved (EINVAL from readlink): nothing stable to run
        if os.path.isfile(real) and os.access(real, os.X_OK):
            return real
    return None
