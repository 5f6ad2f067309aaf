"""`airlock run`'s exit status for an airlock error, as a shell would give it, and the wrong-socket hints.

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


def wrong_door(code: object, socket_path: str, *, operator_command: bool) -> str | None:
    """A hint when a client seems to have reached the other door (what the CLI knows locally).

    The doors themselves say no more than ``unknown_verb`` or ``unauthorized``
    (a probing agent learns nothing from them); the CLI knows which socket it
    was given and what it asked, so it can tell its user.
    """
    name = socket_path.rsplit("/", 1)[-1]
    if not operator_command and code == "unknown_verb":
        return (
            f"{socket_path} is not an agent socket (it has no exec); agents use agent.sock, "
            "e.g. /run/airlock/agent.sock (or set AIRLOCK_SOCKET)"
        )
    if operator_command and code == "unauthorized" and name == "agent.sock":
        return (
            f"{socket_path} is the agent socket; operator commands use operator.sock, "
            "e.g. /run/airlock/operator.sock (or set AIRLOCK_OPERATOR_SOCKET)"
        )
    return None


def refused_token(code: object, token_sent: bool) -> str | None:
    """A hint when a request with a session token is refused: the door says only ``unauthorized``.

    The CLI knows it sent a token; the agent's user is told where to look,
    and nothing the server would not say is revealed.
    """
    if not token_sent or code != "unauthorized":
        return None
    return (
        "the session token (--token-file or $AIRLOCK_TOKEN) was refused: it may be wrong, expired, "
        "revoked, or issued for another user; ask an operator for a new one (airlock token issue)"
    )


def for_answer(decision: object, not_found: bool) -> int:
    """`airlock can`'s exit status: 0 runs at once, 1 asks an operator, 126 refused, 127 not found."""
    if not_found:
        return EXIT_NOT_FOUND
    return (
        {"allow": 0, "ask": 1, "deny": EXIT_DENIED}.get(decision, EXIT_AIRLOCK_ERROR)
        if isinstance(decision, str)
        else EXIT_AIRLOCK_ERROR
    )
