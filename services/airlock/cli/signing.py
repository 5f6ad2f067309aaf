"""`airlock approve/deny --sign KEYFILE` and `--signature FILE`: an operator's signature (issue 18).

The statement comes from approval (`statement` on operator.sock) and is
signed here, as the operator, by OpenSSH's own ``ssh-keygen -Y sign -n
airlock-approval -f KEYFILE`` (a passphrase or a FIDO2 touch is asked on the
terminal, as ssh-keygen always does).  Only the signature goes back.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airlock.common.wire import operator as op
from airlock.common.wire.verb import Verb

NAMESPACE = "airlock-approval"
SSH_KEYGEN = "ssh-keygen"
SIGN_SECONDS = 120.0  # time for a passphrase or a security key's touch
MAX_SIGNATURE_BYTES = 16 * 1024


class SigningError(Exception):
    pass


def read_signature_file(name: str) -> str:
    try:
        data = sys.stdin.read(MAX_SIGNATURE_BYTES + 1) if name == "-" else Path(name).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise SigningError(f"cannot read the signature {name}: {exc}") from None
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SigningError(f"{name}: a signature is at most {MAX_SIGNATURE_BYTES} bytes")
    return data


def sign(
    ns: argparse.Namespace,
    operator: Callable[[argparse.Namespace, Verb[op.Statement, Any], op.Statement], tuple[int, dict[str, Any]]],
    decision: str,
) -> str:
    quiet = argparse.Namespace(**{**vars(ns), "json": False})
    expect = getattr(ns, "expect", None) or None  # never sign another request's statement
    rc, data = operator(quiet, op.STATEMENT, op.Statement(ns.id, expect, decision))
    if rc != 0:
        raise SigningError("could not fetch the statement to sign")
    statement = str(data.get("statement") or "")
    try:
        done = subprocess.run(  # noqa: S603  ssh-keygen -Y sign with the operator's own key file
            [SSH_KEYGEN, "-Y", "sign", "-n", NAMESPACE, "-f", ns.sign],
            input=statement.encode("ascii"),
            stdout=subprocess.PIPE,
            timeout=SIGN_SECONDS,
            check=False,
        )
    except FileNotFoundError:
        raise SigningError("ssh-keygen is not installed (openssh-client)") from None
    except subprocess.TimeoutExpired:
        raise SigningError(f"ssh-keygen did not sign within {SIGN_SECONDS:g}s") from None
    if done.returncode != 0 or not done.stdout:
        raise SigningError(f"ssh-keygen -Y sign failed (exit {done.returncode})")
    return done.stdout.decode("ascii", "replace")
