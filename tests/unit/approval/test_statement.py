"""The signed-approval statement (issue 18): canonical, injective, parseable; SSHSIG armour read strictly."""

from __future__ import annotations

import base64
import dataclasses
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airlock.approval.statement import (
    FIELDS,
    Statement,
    StatementError,
    allowed_principals,
    parse,
    read_signature,
)

texts = st.text(max_size=40)
statements = st.builds(
    Statement,
    host=texts,
    request=st.text(min_size=1, max_size=40),
    binding=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    fleet_binding=st.sampled_from(["", "c" * 64, "d" * 64]),
    decision=st.sampled_from(["allow", "deny"]),
    expires=st.integers(min_value=0, max_value=253_402_300_799),
    nonce=st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    requester=texts,
    run_as=texts,
    command=texts,
    reason=texts,
    cwd=texts,
    stdin=texts,
)


def example(**changes: object) -> Statement:
    base = Statement(
        "web1",
        "req-1",
        "a" * 64,
        "allow",
        1_900_000_000,
        "0" * 32,
        "agent (uid 1000)",
        "root (uid 0)",
        "apt-get update",
        "patch Tuesday",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_statement_reads_as_documented() -> None:
    assert example(cwd="/etc", stdin="12 bytes, sha256 abc", fleet_binding="f" * 64).render() == (
        "airlock approval statement v3\n"
        'host: "web1"\n'
        'request: "req-1"\n'
        f'binding: "{"a" * 64}"\n'
        f'fleet_binding: "{"f" * 64}"\n'
        'decision: "allow"\n'
        'expires: "1900000000" (2030-03-17T17:46:40Z)\n'
        f'nonce: "{"0" * 32}"\n'
        'requester: "agent (uid 1000)"\n'
        'run_as: "root (uid 0)"\n'
        'command: "apt-get update"\n'
        'cwd: "/etc"\n'
        'stdin: "12 bytes, sha256 abc"\n'
        'reason: "patch Tuesday"\n'
        'arguments: ""\n'
        'credentials: ""\n'
    )


@given(statements)
def test_parse_reads_back_what_render_wrote(statement: Statement) -> None:
    text = statement.render()
    assert text.isascii() and text.count("\n") == len(FIELDS) + 1  # no value adds a line
    assert parse(text) == statement


@given(statements, statements)
def test_different_statements_are_different_bytes(a: Statement, b: Statement) -> None:
    assert (a.to_bytes() == b.to_bytes()) == (a == b)


def test_a_value_cannot_forge_another_field() -> None:
    sneaky = example(reason='x"\ndecision: "deny')
    assert parse(sneaky.render()).decision == "allow"
    assert sneaky.render().count("\ndecision:") == 1


@pytest.mark.parametrize(
    "change",
    [
        {"decision": "maybe"},
        {"binding": "A" * 64},
        {"fleet_binding": "a" * 63},
        {"nonce": "x"},
        {"expires": -1},
        {"expires": 10**12},
        {"request": ""},
    ],
)
def test_a_bad_field_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(StatementError):
        example(**change)


def test_text_not_in_canonical_form_is_refused() -> None:
    with pytest.raises(StatementError):
        parse(example().render().replace('"web1"', '"w\\u0065b1"'))


def _blob(namespace: bytes, key_type: bytes = b"ssh-ed25519", trailing: bytes = b"") -> str:
    def s(b: bytes) -> bytes:
        return struct.pack(">I", len(b)) + b

    pub = s(key_type) + s(b"k" * 32)
    blob = b"SSHSIG" + struct.pack(">I", 1) + s(pub) + s(namespace) + s(b"") + s(b"sha512") + s(b"sig") + trailing
    return "-----BEGIN SSH SIGNATURE-----\n" + base64.b64encode(blob).decode() + "\n-----END SSH SIGNATURE-----\n"


def test_the_armour_gives_namespace_key_type_and_fingerprint() -> None:
    sig = read_signature(_blob(b"airlock-approval"))
    assert (sig.namespace, sig.key_type) == ("airlock-approval", "ssh-ed25519")
    assert sig.fingerprint.startswith("SHA256:") and len(sig.digest) == 64


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello", "not an armoured SSH signature"),
        ("-----BEGIN SSH SIGNATURE-----\n!!!\n-----END SSH SIGNATURE-----", "not base64"),
        ("-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----", "SSHSIG"),
        (_blob(b"x", trailing=b"junk"), "trailing bytes"),
        (
            "-----BEGIN SSH SIGNATURE-----\n"
            + base64.b64encode(b"SSHSIG\0\0\0\1\0\0\1\0").decode()
            + "\n-----END SSH SIGNATURE-----",
            "truncated",
        ),
        ("x" * 20000, "at most"),
    ],
)
def test_bad_armour_is_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(StatementError, match=message):
        read_signature(text)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_a_signature_or_a_statement_error(data: bytes) -> None:
    text = (
        "-----BEGIN SSH SIGNATURE-----\n"
        + base64.b64encode(b"SSHSIG" + data).decode()
        + "\n-----END SSH SIGNATURE-----"
    )
    try:
        read_signature(text)
    except StatementError:
        pass


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed (openssh-client)")
def test_a_real_signature_reads_like_ssh_keygen_says(tmp_path: Path) -> None:
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    signed = subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-n", "airlock-approval", "-f", str(key)],
        input=b"text\n",
        capture_output=True,
        check=True,
    ).stdout.decode()
    listed = subprocess.run(
        ["ssh-keygen", "-lf", f"{key}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()
    sig = read_signature(signed)
    assert (sig.namespace, sig.key_type, sig.fingerprint) == ("airlock-approval", "ssh-ed25519", listed[1])


def test_allowed_principals_reads_the_first_field() -> None:
    text = (
        "# comment\n\nalice ssh-ed25519 AAAA\n"
        'bob,carol@example.org namespaces="airlock-approval" ssh-ed25519 BBBB\n"d e" ssh-ed25519 C\n'
    )
    assert allowed_principals(text) == ("alice", "bob", "carol@example.org", "d e")
