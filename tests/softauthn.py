"""A software WebAuthn authenticator for the passkey tests (issue 33): real keys, real bytes, no browser.

`SoftAuthenticator` holds an EC P-256 key (``cryptography``) and makes what a
browser hands airlock-web: a registration (``clientDataJSON`` and a ``none``
attestation object) and assertions (``clientDataJSON``, authenticator data,
an ECDSA signature over ``authData || sha256(clientDataJSON)``), each as
the JSON a page posts (bytes base64url).  Every part can be bent for an
attack: the origin, the RP ID, the challenge, the flags, the counter.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from fido2 import cbor

UP, UV, AT = 0x01, 0x04, 0x40


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64u(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SoftAuthenticator:
    def __init__(self, origin: str, rp_id: str) -> None:
        self.origin = origin
        self.rp_id = rp_id
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = os.urandom(16)
        self.counter = 0

    @property
    def id(self) -> str:
        return b64u(self.credential_id)

    def cose_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        return bytes(
            cbor.encode({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})
        )

    def _client_data(self, kind: str, challenge: str, origin: str | None) -> bytes:
        data = {"type": kind, "challenge": challenge, "origin": origin or self.origin, "crossOrigin": False}
        return json.dumps(data, separators=(",", ":")).encode()

    def register(
        self, options: dict[str, Any], *, flags: int = UP | UV | AT, origin: str | None = None
    ) -> dict[str, Any]:
        """The PublicKeyCredential a browser posts after ``navigator.credentials.create(options)``."""
        client_data = self._client_data("webauthn.create", options["challenge"], origin)
        rp_id = options["rp"]["id"]
        attested = bytes(16) + struct.pack(">H", len(self.credential_id)) + self.credential_id + self.cose_key()
        auth_data = hashlib.sha256(rp_id.encode()).digest() + bytes([flags]) + struct.pack(">I", self.counter)
        attestation = cbor.encode({"fmt": "none", "attStmt": {}, "authData": auth_data + attested})
        return {
            "id": self.id,
            "rawId": self.id,
            "type": "public-key",
            "response": {"clientDataJSON": b64u(client_data), "attestationObject": b64u(bytes(attestation))},
        }

    def sign(
        self,
        challenge: str,
        *,
        flags: int = UP | UV,
        origin: str | None = None,
        rp_id: str | None = None,
        count: bool = True,
    ) -> dict[str, Any]:
        """The PublicKeyCredential a browser posts after ``navigator.credentials.get`` over ``challenge``."""
        if count:
            self.counter += 1
        client_data = self._client_data("webauthn.get", challenge, origin)
        auth_data = (
            hashlib.sha256((rp_id or self.rp_id).encode()).digest() + bytes([flags]) + struct.pack(">I", self.counter)
        )
        signature = self.key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        return {
            "id": self.id,
            "rawId": self.id,
            "type": "public-key",
            "response": {
                "clientDataJSON": b64u(client_data),
                "authenticatorData": b64u(auth_data),
                "signature": b64u(signature),
                "userHandle": None,
            },
        }
