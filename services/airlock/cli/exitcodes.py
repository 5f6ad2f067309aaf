"""`airlock run`'s exit status for an airlock error, as a shell would give it (both CLI paths).

Imports nothing: `cli/quick.py`, `airlock run`'s short path, uses it too.
"""

from __future__ import annotations

EXIT_APPROVAL_TIMEOUT = 124  # timeout(1)'s: nobody decided in time
EXIT_AIRLOCK_ERROR = 125  # any other airlock error (the message is on stderr)
EXIT_DENIED = 126  # a shell's "found but cannot be run": a rule or an operator said no
EXIT_NOT_FOUND = 127  # a shell's "command not found"

_BY_CODE = {"denied": EXIT_DENIED, "approval_timeout": EXIT_APPROVAL_TIMEOUT, "command_not_found": EXIT_NOT_FOUND}


def for_error(code: object) -> int:
    """The exit status for a refused request's error code."""
    return _BY_CODE.get(code, EXIT_AIRLOCK_ERROR) if isinstance(code, str) else EXIT_AIRLOCK_ERROR
