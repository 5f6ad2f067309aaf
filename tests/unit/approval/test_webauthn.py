"""The pure parts of passkey approvals (issue 33): the decision challenge, parsing, each assertion check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from airlock.approval import webauthn
from airlock.approval.webauthn import Refused
from airlock.common import passkeyfile

from softauthn import UP, UV, SoftAuthenticator, b64u

ORIGIN, RP = "https://airlock.example:8443", "airlock.example"


def test_the_decision_challenge_covers_the_statement_and_what_the_decision_carries() -> None:
    statement = b'airlock approval statement v1\nhost "h"\n'
    plain = webauthn.decision_challenge(statement, webauthn.extras("", None, None))
    assert plain == hashlib.sha256(b"airlock passkey v1\n" + statement + b"\n{}").digest()
    # Any change of statement, reason or grant is another challenge.
    assert webauthn.decision_challenge(statement + b" ", webauthn.extras("", None, None)) != plain
    with_reason = webauthn.decision_challenge(statement, webauthn.extras("fix it", None, None))
    with_grant = webauthn.decision_challenge(statement, webauthn.extras("", 600, "command"))
    assert len({plain, with_reason, with_grant}) == 3
    assert webauthn.extras("r", 600, "rule") == b'{"grant_seconds":600,"reason":"r","scope":"rule"}'


def test_base64url_is_strict() -> None:
    assert webauthn.unb64u(b64u(b"\xff\xfe"), "x") == b"\xff\xfe"
    for bad in ("", "a+b/", "!!", 5, None):
        with pytest.raises(Refused) as err:
            webauthn.unb64u(bad, "x")
        assert err.value.reason == "malformed"


def _registered(auth: SoftAuthenticator, challenge: bytes) -> webauthn.Registered:
    options = webauthn.creation_options(RP, "airlock", "alice", challenge, [])
    assert options["authenticatorSelection"] == {"userVerification": "required", "residentKey": "preferred"}
    return webauthn.verify_registration(auth.register(options), ORIGIN, RP, challenge)


def test_a_registration_is_checked_and_gives_the_key() -> None:
    auth = SoftAuthenticator(ORIGIN, RP)
    found = _registered(auth, b"c" * 32)
    assert found.credential_id == auth.credential_id and found.public_key == auth.cose_key()
    options = webauthn.creation_options(RP, "airlock", "alice", b"c" * 32, [])
    for bent, reason in (
        (auth.register(options, origin="https://evil.example"), "origin"),
        (auth.register(options, flags=UP | 0x40), "user_verification"),
    ):
        with pytest.raises(Refused) as err:
            webauthn.verify_registration(bent, ORIGIN, RP, b"c" * 32)
        assert err.value.reason == reason
    with pytest.raises(Refused) as err:
        webauthn.verify_registration(auth.register(options), ORIGIN, RP, b"d" * 32)
    assert err.value.reason == "challenge"


def test_each_assertion_check_refuses_with_its_reason() -> None:
    auth = SoftAuthenticator(ORIGIN, RP)
    key = _registered(auth, b"c" * 32).public_key
    challenge = b"k" * 32

    def check(credential: dict[str, object], want: bytes = challenge) -> int:
        return webauthn.verify_assertion(webauthn.parse_assertion(credential, ORIGIN), RP, want, key)

    assert check(auth.sign(b64u(challenge))) == 1  # control
    cases = [
        (auth.sign(b64u(b"x" * 32)), "challenge"),
        (auth.sign(b64u(challenge), rp_id="evil.example"), "rp_id"),
        (auth.sign(b64u(challenge), flags=UP), "user_verification"),
        (auth.sign(b64u(challenge), flags=UV), "user_presence"),
    ]
    for credential, reason in cases:
        with pytest.raises(Refused) as err:
            check(credential)
        assert err.value.reason == reason
    with pytest.raises(Refused) as err:
        webauthn.parse_assertion(auth.sign(b64u(challenge), origin="https://airlock.example"), ORIGIN)
    assert err.value.reason == "origin"  # the port is part of the origin
    other = SoftAuthenticator(ORIGIN, RP)
    forged = other.sign(b64u(challenge)) | {"id": auth.id, "rawId": auth.id}
    with pytest.raises(Refused) as err:
        check(forged)
    assert err.value.reason == "signature"


def test_malformed_credentials_are_refused_not_crashed() -> None:
    cases: list[object] = [None, [], {"type": "other"}, {"id": "AA", "rawId": "AA"}, {"rawId": "AA", "response": {}}]
    for bad in cases:
        with pytest.raises(Refused):
            webauthn.parse_assertion(bad, ORIGIN)
    junk = {"rawId": "AA", "response": {"clientDataJSON": b64u(b"{"), "authenticatorData": "AA", "signature": "AA"}}
    with pytest.raises(Refused):
        webauthn.parse_assertion(junk, ORIGIN)


def test_a_passkeys_file_line_is_validated_and_bad_lines_are_skipped() -> None:
    auth = SoftAuthenticator(ORIGIN, RP)
    good = {"credential_id": auth.id, "public_key": b64u(auth.cose_key()), "account": "alice", "created": 1}
    text = "\n".join(
        [
            json.dumps(good),
            json.dumps(good | {"account": "bad name"}),
            json.dumps(good | {"public_key": b64u(b"not cbor")}),
            "not json",
            "# a comment",
        ]
    )
    found, bad = passkeyfile.parse(text)
    assert [c.account for c in found] == ["alice"] and bad == [2, 3, 4]
    assert passkeyfile.checked(json.loads(found[0].to_line())) == found[0]


def test_the_passkeys_file_is_rewritten_atomically_and_never_through_a_symlink(tmp_path: Path) -> None:
    auth = SoftAuthenticator(ORIGIN, RP)
    line = passkeyfile.Credential(auth.id, b64u(auth.cose_key()), "alice", 1).to_line()
    target = tmp_path / "passkeys"
    passkeyfile.rewrite(target, lambda lines, found: [*lines, line])
    assert target.read_text() == line + "\n" and (target.stat().st_mode & 0o777) == 0o644
    assert [c.account for c in passkeyfile.read(target)[0]] == ["alice"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    target.unlink()
    target.symlink_to(elsewhere)
    with pytest.raises(OSError, match="symbolic links"):
        passkeyfile.rewrite(target, lambda lines, found: [*lines, line])
    with pytest.raises(OSError, match="symbolic links"):
        passkeyfile.read(target)
    assert elsewhere.read_text() == "" and sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "passkeys"]


def test_a_credential_id_of_a_length_no_base64_has_is_refused_not_a_crash() -> None:
    """The runner's passkeys.write gets a clear refusal, never an internal error, for 4n + 1 characters."""

    with pytest.raises(passkeyfile.PasskeyFileError, match="credential_id"):
        passkeyfile.checked({"credential_id": "abcde", "public_key": "AA", "account": "alice", "created": 1})


def test_a_key_of_an_algorithm_fido2_cannot_verify_is_refused_at_enrollment() -> None:
    """fido2 parses an unknown COSE algorithm as UnsupportedKey (it never verifies): such a passkey could
    never sign in or approve, so enrolling it is refused with the reason, not accepted and useless."""
    from fido2 import cbor

    auth = SoftAuthenticator(ORIGIN, RP)
    good = {"credential_id": auth.id, "public_key": b64u(auth.cose_key()), "account": "alice", "created": 1}
    assert passkeyfile.checked(good).account == "alice"  # control: the authenticator's own key is fine
    unknown = dict(cbor.decode(auth.cose_key())) | {3: 999999}  # an algorithm fido2 has no class for
    with pytest.raises(passkeyfile.PasskeyFileError, match="public_key"):
        passkeyfile.checked(good | {"public_key": b64u(cbor.encode(unknown))})


def test_a_passkeys_file_over_its_bound_is_refused_not_rewritten_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = SoftAuthenticator(ORIGIN, RP)
    line = passkeyfile.Credential(auth.id, b64u(auth.cose_key()), "alice", 1).to_line()
    target = tmp_path / "passkeys"
    before = "".join(line + "\n" for _ in range(3))
    target.write_text(before)
    monkeypatch.setattr(passkeyfile, "MAX_BYTES", len(before) - 1)
    # A revocation (one line fewer) of a file read cut at the bound would fit, and lose the file's tail.
    with pytest.raises(passkeyfile.PasskeyFileError, match="larger than"):
        passkeyfile.rewrite(target, lambda lines, found: lines[1:])
    assert target.read_text() == before  # not replaced by a copy cut at the bound
