"""Signed approvals (issue 18): the canonical statement an operator signs, and SSHSIG armour.

A *statement* is the exact text an operator signs with ``ssh-keygen -Y sign
-n airlock-approval``: which host, which request, the ticket binding (the
spec's digest and everything approval bound for it -- binaries' identities, a
reviewed file's hash, the confinement), the decision, an expiry, and a nonce
fresh for each pending request.  The nonce makes a signature good for exactly
one pending request: the same request ID asked again, or after a restart, gets
a new statement and an old signature verifies over none of it.  The command,
the run-as user, the requester and the path arguments someone other than root
can change (flagged, with the bound hash), the working directory and the
standard input (size and sha256: issue 45, the bytes are not in a statement)
are repeated for the human reading it on a phone; they are covered by the
binding anyway.

Every value is written as a JSON string (ASCII only), so no value can add a
line, and `render` is injective: two statements differ in bytes whenever they
differ in any field (`parse` reads them back; tests check both).

The armoured signature (``-----BEGIN SSH SIGNATURE-----``) is read here only
to learn its namespace and key before anything is run: the verification
itself is ``ssh-keygen -Y verify`` (`airlock.approval.signers`).

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
from dataclasses import dataclass
from typing import Final

from airlock.common.codec import iso_utc
from airlock.common.wire import picking

NAMESPACE: Final = "airlock-approval"
SIGN_COMMAND: Final = f"ssh-keygen -Y sign -n {NAMESPACE} -f ~/.ssh/id_ed25519 < statement.txt > statement.sig"
HEADER: Final = "airlock approval statement v3"  # v2: cwd and stdin (issue 45); v3: fleet_binding (issue 49)
DECISIONS: Final = picking.DECISIONS
# Field order is part of the format.
FIELDS: Final = (
    "host",
    "request",
    "binding",
    "fleet_binding",
    "decision",
    "expires",
    "nonce",
    "requester",
    "run_as",
    "command",
    "cwd",
    "stdin",
    "reason",
    "arguments",
    "credentials",
)
MAX_SIGNATURE_BYTES: Final = 16 * 1024
_YEAR_10000: Final = 253_402_300_800

_HEX64 = re.compile(r"[0-9a-f]{64}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_BEGIN = "-----BEGIN SSH SIGNATURE-----"
_END = "-----END SSH SIGNATURE-----"


class StatementError(ValueError):
    """A statement or a signature that cannot be read; the message says why."""


@dataclass(frozen=True, slots=True)
class Statement:
    host: str
    request: str  # the request ID
    binding: str  # ticket_binding(digest, bound): 64 hex digits
    decision: str  # allow or deny
    expires: int  # Unix seconds: the statement (and the pending request) end then
    nonce: str  # 32 hex digits, fresh for each pending request
    requester: str  # "user (uid N)"
    run_as: str
    command: str
    reason: str
    # Issue 27: path arguments someone other than root can change, each with what is bound ("" if none).
    arguments: str = ""
    # Issue 35: the credentials the job would receive, by name and stage ("" if none; never a value).
    credentials: str = ""
    # Issue 45: where a command runs (the runner's default said as one) and its stdin ("none", or
    # "N bytes, sha256 HEX": common/shown.py); "" for a file operation.  Rendered after the command
    # (FIELDS' order is the format's; the attributes' order only keeps positional callers working).
    cwd: str = ""
    stdin: str = ""
    # Issue 49: the binding as any host would compute it for the same request (pending.fleet_binding: no
    # device or inode numbers); what a fleet console groups on.  "" in a statement made without one.
    fleet_binding: str = ""

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise StatementError(f"decision must be allow or deny (got {self.decision!r})")
        if not _HEX64.fullmatch(self.binding):
            raise StatementError("binding must be 64 lowercase hex digits")
        if self.fleet_binding and not _HEX64.fullmatch(self.fleet_binding):
            raise StatementError("fleet_binding must be empty or 64 lowercase hex digits")
        if not _NONCE.fullmatch(self.nonce):
            raise StatementError("nonce must be 32 lowercase hex digits")
        if isinstance(self.expires, bool) or not isinstance(self.expires, int) or not 0 <= self.expires < _YEAR_10000:
            raise StatementError("expires must be Unix seconds before the year 10000")
        if not self.request:
            raise StatementError("request must not be empty")

    def render(self) -> str:
        """The statement's text: what is signed, byte for byte (UTF-8 of this, ASCII in fact)."""
        lines = [HEADER]
        for name in FIELDS:
            value = getattr(self, name)
            text = json.dumps(value if isinstance(value, str) else str(value), ensure_ascii=True)
            if name == "expires":
                text = f"{text} ({iso_utc(self.expires, timespec='seconds')})"
            lines.append(f"{name}: {text}")
        return "\n".join(lines) + "\n"

    def to_bytes(self) -> bytes:
        return self.render().encode("ascii")


def parse(text: str) -> Statement:
    """Read a rendered statement back (the inverse of `Statement.render`)."""
    lines = text.split("\n")
    if len(lines) != len(FIELDS) + 2 or lines[0] != HEADER or lines[-1] != "":
        raise StatementError("not an airlock approval statement")
    values: dict[str, str] = {}
    for name, line in zip(FIELDS, lines[1:-1], strict=True):
        prefix = f"{name}: "
        if not line.startswith(prefix):
            raise StatementError(f"expected the field {name!r}")
        raw = line[len(prefix) :]
        if name == "expires":
            raw = raw.rsplit(" (", 1)[0]
        try:
            value = json.loads(raw)
        except ValueError:
            raise StatementError(f"{name}: not a JSON string") from None
        if not isinstance(value, str):
            raise StatementError(f"{name}: not a JSON string")
        values[name] = value
    if not values["expires"].isdigit():
        raise StatementError("expires: not a number")
    statement = Statement(**(values | {"expires": int(values["expires"])}))  # type: ignore[arg-type]
    if statement.render() != text:
        raise StatementError("not in canonical form")
    return statement


# --- the armoured signature -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Signature:
    """What an armoured SSHSIG says about itself before it is verified."""

    armored: str  # normalised: the BEGIN line, base64 lines, the END line, a final newline
    namespace: str
    key_type: str
    fingerprint: str  # SHA256:... of the public key, as ssh-keygen prints it
    digest: str  # sha256 hex of the signature blob: the replay guard's key


def read_signature(text: str) -> Signature:
    """Parse an armoured SSH signature (PROTOCOL.sshsig); `StatementError` says what is wrong."""
    if len(text) > MAX_SIGNATURE_BYTES:
        raise StatementError(f"a signature is at most {MAX_SIGNATURE_BYTES} bytes")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 3 or lines[0] != _BEGIN or lines[-1] != _END:
        raise StatementError(
            "not an armoured SSH signature (-----BEGIN SSH SIGNATURE----- ... -----END SSH SIGNATURE-----)"
        )
    body = "".join(lines[1:-1])
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise StatementError("the signature's body is not base64") from None
    if blob[:6] != b"SSHSIG":
        raise StatementError("the signature does not start with SSHSIG")
    try:
        offset = 6
        (version,) = struct.unpack(">I", blob[offset : offset + 4])
        offset += 4
        public_key, offset = _string(blob, offset)
        namespace, offset = _string(blob, offset)
        _reserved, offset = _string(blob, offset)
        _hash, offset = _string(blob, offset)
        _sig, offset = _string(blob, offset)
        key_type, _ = _string(public_key, 0)
    except (struct.error, IndexError):
        raise StatementError("the signature is truncated") from None
    if version != 1:
        raise StatementError(f"unsupported SSHSIG version {version}")
    if offset != len(blob):
        raise StatementError("the signature has trailing bytes")
    fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(public_key).digest()).decode().rstrip("=")
    armored = "\n".join([_BEGIN, *(body[i : i + 70] for i in range(0, len(body), 70)), _END]) + "\n"
    return Signature(
        armored=armored,
        namespace=namespace.decode("utf-8", "replace"),
        key_type=key_type.decode("ascii", "replace"),
        fingerprint=fingerprint,
        digest=hashlib.sha256(blob).hexdigest(),
    )


def _string(blob: bytes, offset: int) -> tuple[bytes, int]:
    (length,) = struct.unpack(">I", blob[offset : offset + 4])
    start = offset + 4
    if start + length > len(blob):
        raise IndexError("string past the end")
    return blob[start : start + length], start + length


def allowed_principals(text: str) -> tuple[str, ...]:
    """The principal patterns an allowed_signers file names (first field of each line).

    Only to tell an unknown principal from a wrong key in a refusal's message;
    ``ssh-keygen`` alone decides whether a signature is good.
    """
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith('"'):
            end = line.find('"', 1)
            field = line[1:end] if end > 0 else ""
        else:
            field = line.split(None, 1)[0]
        out.extend(p for p in field.split(",") if p)
    return tuple(out)
