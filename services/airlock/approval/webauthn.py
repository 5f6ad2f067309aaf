"""WebAuthn for passkey approvals (issue 33): options, parsing, and the checks approval makes itself.

airlock-web only carries what the browser made; approval checks every part
of it here: the client data's type, origin and challenge, the RP ID hash,
the user-present and user-verified flags, the signature against the enrolled
COSE key, and (in `passkeys`) the sign counter.  A decision's challenge is
derived from the request's statement (`decision_challenge`), so an assertion
is good for one decision of one pending request only.

Parsing and signatures use Debian's python3-fido2 (0.9.1): its
``Fido2Server.register_complete`` checks a registration (attestation
``none`` accepted); assertions are checked step by step below, so each
refusal says which check failed.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

# fido2 (and the cryptography it loads) is imported where an assertion or a registration is
# checked, not at approval's start: it was most of a cold start's imports (issue 37).
if TYPE_CHECKING:
    from fido2.client import ClientData
    from fido2.ctap2 import AuthenticatorData

CONTEXT: Final = b"airlock passkey v1\n"
_B64U: Final = re.compile(r"[A-Za-z0-9_-]+={0,2}")
TIMEOUT_MS: Final = 120_000
# ES256, EdDSA, RS256: what CoseKey verifies.
ALGORITHMS: Final = (-7, -8, -257)
MAX_FIELD_BYTES: Final = 64 * 1024  # one base64url field of a browser credential, decoded
MAX_CREDENTIAL_ID_BYTES: Final = 1023  # WebAuthn's limit


class Refused(Exception):
    """A check failed: ``reason`` is the short name (details.reason), the message says which."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64u(text: object, field: str, max_bytes: int = MAX_FIELD_BYTES) -> bytes:
    """Strict base64url (padding optional); `Refused` ``malformed`` otherwise."""
    if not isinstance(text, str) or not text or len(text) > (max_bytes * 4) // 3 + 4:
        raise Refused("malformed", f"{field}: must be base64url text")
    if not _B64U.fullmatch(text):
        raise Refused("malformed", f"{field}: must be base64url text (A-Z a-z 0-9 - _)")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise Refused("malformed", f"{field}: must be base64url text") from None
    if len(data) > max_bytes:
        raise Refused("malformed", f"{field}: too long")
    return data


def extras(reason: str, grant_seconds: float | None, scope: str | None) -> bytes:
    """The canonical JSON of what a decision carries besides the statement (only what is given)."""
    given: dict[str, Any] = {}
    if reason:
        given["reason"] = reason
    if grant_seconds is not None:
        given["grant_seconds"] = grant_seconds
    if scope is not None:
        given["scope"] = scope
    return json.dumps(given, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decision_challenge(statement: bytes, carried: bytes) -> bytes:
    """sha256(b"airlock passkey v1\\n" + statement + b"\\n" + extras): one decision of one pending request."""
    return hashlib.sha256(CONTEXT + statement + b"\n" + carried).digest()


def user_handle(account: str) -> bytes:
    """A stable, opaque WebAuthn user ID for an account (no name in it)."""
    return hashlib.sha256(b"airlock user\n" + account.encode("utf-8")).digest()[:16]


def creation_options(rp_id: str, rp_name: str, account: str, challenge: bytes, exclude: list[str]) -> dict[str, Any]:
    """PublicKeyCredentialCreationOptions as JSON (bytes base64url)."""
    return {
        "rp": {"id": rp_id, "name": rp_name},
        "user": {"id": b64u(user_handle(account)), "name": account, "displayName": account},
        "challenge": b64u(challenge),
        "pubKeyCredParams": [{"type": "public-key", "alg": alg} for alg in ALGORITHMS],
        "timeout": TIMEOUT_MS,
        "excludeCredentials": [{"type": "public-key", "id": c} for c in exclude],
        "authenticatorSelection": {"userVerification": "required", "residentKey": "preferred"},
        "attestation": "none",
    }


def request_options(rp_id: str, challenge: bytes, allow: list[str]) -> dict[str, Any]:
    """PublicKeyCredentialRequestOptions as JSON (bytes base64url)."""
    return {
        "challenge": b64u(challenge),
        "rpId": rp_id,
        "timeout": TIMEOUT_MS,
        "userVerification": "required",
        "allowCredentials": [{"type": "public-key", "id": c} for c in allow],
    }


def _response(credential: object) -> tuple[bytes, Mapping[str, Any]]:
    if not isinstance(credential, dict) or credential.get("type", "public-key") != "public-key":
        raise Refused("malformed", "credential: must be a PublicKeyCredential as JSON (type public-key)")
    raw = unb64u(credential.get("rawId") or credential.get("id"), "credential.rawId", MAX_CREDENTIAL_ID_BYTES)
    if credential.get("id") is not None and unb64u(credential["id"], "credential.id", MAX_CREDENTIAL_ID_BYTES) != raw:
        raise Refused("malformed", "credential: id and rawId differ")
    response = credential.get("response")
    if not isinstance(response, dict):
        raise Refused("malformed", "credential.response: must be an object")
    return raw, response


def _client_data(response: Mapping[str, Any], expected_type: str, origin: str) -> ClientData:
    from fido2.client import ClientData

    raw = unb64u(response.get("clientDataJSON"), "credential.response.clientDataJSON")
    try:
        data = ClientData(raw)
        kind, seen = data.get("type"), data.get("origin")
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise Refused("malformed", "clientDataJSON: not a client data object") from None
    if kind != expected_type:
        raise Refused("malformed", f"clientDataJSON: type {kind!r}, not {expected_type!r}")
    if not origin or seen != origin:
        raise Refused("origin", f"the browser's origin {seen!r} is not {origin!r} (web.url)")
    return data


@dataclass(frozen=True, slots=True)
class Registered:
    credential_id: bytes
    public_key: bytes  # the COSE key, CBOR
    sign_count: int


def verify_registration(credential: object, origin: str, rp_id: str, challenge: bytes) -> Registered:
    """A registration (``navigator.credentials.create``) checked against this origin, RP and challenge."""
    from fido2 import cbor
    from fido2.ctap2 import AttestationObject
    from fido2.server import Fido2Server
    from fido2.webauthn import PublicKeyCredentialRpEntity

    raw_id, response = _response(credential)
    client_data = _client_data(response, "webauthn.create", origin)
    try:
        attestation = AttestationObject(unb64u(response.get("attestationObject"), "attestationObject"))
    except Refused:
        raise
    except Exception:
        raise Refused("malformed", "attestationObject: not an attestation object") from None
    server = Fido2Server(PublicKeyCredentialRpEntity(rp_id, "airlock"), verify_origin=lambda o: o == origin)
    state = {"challenge": b64u(challenge), "user_verification": "required"}
    try:
        auth_data = server.register_complete(state, client_data, attestation)
    except ValueError as exc:
        raise Refused(_registration_reason(str(exc)), f"registration refused: {exc}") from None
    found = auth_data.credential_data
    if found is None or found.credential_id != raw_id:
        raise Refused("malformed", "the attested credential is not the one sent")
    return Registered(bytes(found.credential_id), cbor.encode(dict(found.public_key)), int(auth_data.counter))


def _registration_reason(message: str) -> str:
    lowered = message.lower()
    for needle, reason in (
        ("origin", "origin"),
        ("challenge", "challenge"),
        ("rp id", "rp_id"),
        ("verified", "user_verification"),
        ("present", "user_presence"),
    ):
        if needle in lowered:
            return reason
    return "malformed"


@dataclass(frozen=True, slots=True)
class Assertion:
    credential_id: bytes
    client_data: ClientData
    auth_data: AuthenticatorData
    signature: bytes

    @property
    def digest(self) -> str:
        """What identifies this assertion (a replay is the same signature over the same data)."""
        return hashlib.sha256(bytes(self.auth_data) + self.client_data.hash + self.signature).hexdigest()


def parse_assertion(credential: object, origin: str) -> Assertion:
    """A ``navigator.credentials.get`` result, read (and its origin checked); nothing verified yet."""
    from fido2.ctap2 import AuthenticatorData

    raw_id, response = _response(credential)
    client_data = _client_data(response, "webauthn.get", origin)
    try:
        auth_data = AuthenticatorData(unb64u(response.get("authenticatorData"), "authenticatorData"))
    except Refused:
        raise
    except Exception:
        raise Refused("malformed", "authenticatorData: not authenticator data") from None
    signature = unb64u(response.get("signature"), "signature")
    return Assertion(raw_id, client_data, auth_data, signature)


def verify_assertion(assertion: Assertion, rp_id: str, challenge: bytes, public_key: bytes) -> int:
    """Check challenge, RP ID hash, UP and UV flags and the signature; the authenticator's sign counter."""
    from fido2 import cbor
    from fido2.cose import CoseKey

    if not hmac_equal(assertion.client_data.challenge, challenge):
        raise Refused("challenge", "the assertion signs another challenge (another request, decision or statement)")
    if not hmac_equal(assertion.auth_data.rp_id_hash, hashlib.sha256(rp_id.encode("utf-8")).digest()):
        raise Refused("rp_id", f"the assertion is for another relying party than {rp_id!r} (web.rp_id)")
    if not assertion.auth_data.is_user_present():
        raise Refused("user_presence", "the authenticator did not report the user present")
    if not assertion.auth_data.is_user_verified():
        raise Refused("user_verification", "the authenticator did not verify the user (PIN or biometric required)")
    try:
        key = CoseKey.parse(cbor.decode(public_key))
        key.verify(bytes(assertion.auth_data) + assertion.client_data.hash, assertion.signature)
    except Exception:
        raise Refused("signature", "the signature does not verify with the enrolled public key") from None
    return int(assertion.auth_data.counter)


def hmac_equal(a: bytes, b: bytes) -> bool:
    import hmac

    return hmac.compare_digest(bytes(a), bytes(b))
