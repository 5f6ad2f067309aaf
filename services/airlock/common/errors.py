"""The closed set of error codes that may cross a socket.

Only a code and a message ever reach a peer: never a class name, never a
traceback.  Every service raises `AirlockError` for refusals; only the service
shell catches anything broader and turns it into `internal`.

Pure: no I/O.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.StrEnum):
    # Envelope and protocol (reference/004).
    INVALID_REQUEST = "invalid_request"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_VERB = "unknown_verb"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    INTERNAL = "internal"
    # Framing.
    REQUEST_TOO_LARGE = "request_too_large"
    MISSING_NEWLINE = "missing_newline"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    READ_TIMEOUT = "read_timeout"
    # The life of a request.
    BUSY = "busy"
    RATE_LIMITED = "rate_limited"  # a per-agent (uid) quota or limit (journal bytes, refused signatures) is used up
    STALE_REQUEST = "stale_request"
    REPLAYED_REQUEST = "replayed_request"
    DENIED = "denied"
    COMMAND_NOT_FOUND = "command_not_found"  # argv[0] is no executable on the job's secure PATH
    APPROVAL_TIMEOUT = "approval_timeout"
    APPROVAL_REQUIRED = "approval_required"  # a person would be asked, and the request said not to wait (sudo -n)
    APPROVAL_INTERRUPTED = "approval_interrupted"
    WITHDRAWN = "withdrawn"
    APPROVAL_UNAVAILABLE = "approval_unavailable"
    AUDIT_UNAVAILABLE = "audit_unavailable"
    RUNNER_UNAVAILABLE = "runner_unavailable"
    PRIVILEGE_UNAVAILABLE = "privilege_unavailable"
    IDENTITY_UNAVAILABLE = "identity_unavailable"  # the user database could not be read: who asks is unknown
    INVALID_TICKET = "invalid_ticket"
    SPAWN_FAILED = "spawn_failed"
    BINARY_CHANGED = "binary_changed"  # the binary is no longer the file approval saw
    UNSAFE_BINARY = "unsafe_binary"  # a root job's binary or a parent directory is not root's alone
    ARGUMENT_CHANGED = "argument_changed"  # a root job's bound path argument is not the file approval saw
    CREDENTIAL_UNSAFE = "credential_unsafe"  # a rule's credential file is missing, a symlink, or not root's alone
    # File operations (issue 15).
    FILE_CHANGED = "file_changed"
    LIMIT_EXCEEDED = "limit_exceeded"
    # Signed approvals, quorum and reasons (issue 18).
    SIGNATURE_INVALID = "signature_invalid"  # unreadable, or does not verify over this request's statement
    SIGNATURE_WRONG_KEY = (
        "signature_wrong_key"  # the key that signed is not in allowed_signers (or not the principal's)
    )
    SIGNER_UNKNOWN = "signer_unknown"  # the principal is not in allowed_signers, or not among the rule's approvers
    SIGNATURE_WRONG_NAMESPACE = "signature_wrong_namespace"  # not signed with -n airlock-approval
    SIGNATURE_OTHER_REQUEST = "signature_other_request"  # a good signature over another request's statement
    STATEMENT_EXPIRED = "statement_expired"  # the statement's expiry passed (the request timed out)
    SIGNATURE_REPLAYED = "signature_replayed"  # this signature was already used
    REASON_REQUIRED = "reason_required"  # the rule (or approval.operator_reason) wants a reason of min length
    # Exact references (issue 27).
    REQUEST_CHANGED = "request_changed"  # --expect does not match the request pending now under that ID
    # Operations (reference/001).
    OPERATION_ID_CONFLICT = "operation_id_conflict"
    OPERATION_IN_PROGRESS = "operation_in_progress"
    PROTECTED_REDELIVERY_FORBIDDEN = "protected_redelivery_forbidden"


class AirlockError(Exception):
    """A refusal or failure that is reported to the peer as a structured error."""

    def __init__(self, code: ErrorCode, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def __repr__(self) -> str:
        return f"AirlockError({self.code.value!r}, {self.message!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, "details": self.details}


# reference/004's closed list: what a client of the operator door may see.
REFERENCE_004_CODES = frozenset(
    {
        ErrorCode.INVALID_ARGUMENTS,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.UNKNOWN_VERB,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.NOT_FOUND,
        ErrorCode.CONFLICT,
        ErrorCode.INTERNAL,
    }
)


def within_reference_004(error: AirlockError) -> AirlockError:
    """The same error with a code from reference/004's list; the precise one stays in details.reason.

    Framing and domain codes (invalid_json, request_too_large, denied, ...)
    become invalid_request or conflict, so a client written against the
    closed list never meets a code it does not know.
    """
    if error.code in REFERENCE_004_CODES:
        return error
    mapped = ErrorCode.CONFLICT if error.code in _CONFLICTS else ErrorCode.INVALID_REQUEST
    if error.code in _UNAVAILABLE:
        mapped = ErrorCode.INTERNAL
    return AirlockError(mapped, error.message, {"reason": error.code.value, **error.details})


_CONFLICTS = frozenset(
    {
        ErrorCode.OPERATION_ID_CONFLICT,
        ErrorCode.OPERATION_IN_PROGRESS,
        ErrorCode.BUSY,
        ErrorCode.REQUEST_CHANGED,
        ErrorCode.RATE_LIMITED,
    }
)
_UNAVAILABLE = frozenset(
    {
        ErrorCode.AUDIT_UNAVAILABLE,
        ErrorCode.RUNNER_UNAVAILABLE,
        ErrorCode.APPROVAL_UNAVAILABLE,
        ErrorCode.IDENTITY_UNAVAILABLE,
    }
)
