"""An agent cannot forge, re-label or replay an operator's signed approval (issue 18).

The agent door accepts `approve_signed`, so the party that wants the command
to run carries the signature: it may try its own key, a genuine signature for
another request, a used one, or a tampered one.  Each is refused, journaled,
and the command (which would leave a marker file) never runs.

The control, in each test: the genuine signature for the right request, sent
through the very same door, runs the command -- so the refusals are not an
artefact of a setup that could never approve anything.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Background, Stack, custom_stack, wait_pending

pytestmark = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed (openssh-client)"
)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(tmp_path_factory.mktemp("seckeys"))
    for name in ("alice", "agent"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(folder / name)], check=True
        )
    pub = (folder / "alice.pub").read_text().split()
    (folder / "allowed_signers").write_text(f"alice {pub[0]} {pub[1]}\n")
    return folder


@pytest.fixture(scope="module")
def sstack(tmp_path_factory: pytest.TempPathFactory, keys: Path) -> Iterator[Stack]:
    config = (
        "operators:\n  users: [daemon]\n"  # alice is the operator account daemon (issue 27)
        f"approval:\n  timeout_seconds: 60\n  allowed_signers: {keys / 'allowed_signers'}\n"
        "  signer_accounts: {alice: daemon}\npolicy:\n  default: ask\n"
    )
    with custom_stack(Path(tmp_path_factory.mktemp("ssa")), config) as s:
        yield s


def sign(keys: Path, name: str, text: str) -> str:
    return subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-n", "airlock-approval", "-f", str(keys / name)],
        input=text.encode(),
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()


def statement(stack: Stack, request_id: str) -> str:
    # The statement comes from the operator door; an agent could also read it in a relay message.
    reply = stack.native("statement", {"id": request_id}, path=stack.operator)
    text: str = reply["data"]["statement"]
    return text


def carry(stack: Stack, request_id: str, signature: str, **extra: str) -> dict[str, object]:
    return stack.native("approve_signed", {"request_id": request_id, "signature": signature} | extra)


def refusals(stack: Stack, request_id: str) -> list[str]:
    return [
        json.loads(r["payload"])["code"]
        for r in stack.journal_rows()
        if r["request_id"] == request_id
        and r["kind"] == "operator.action"
        and json.loads(r["payload"]).get("action") == "signature.refused"
    ]


def test_the_agents_own_key_claiming_a_principal_is_refused(sstack: Stack, keys: Path, tmp_path: Path) -> None:
    marker = tmp_path / "forged"
    job = Background(sstack, {"argv": ["touch", str(marker)]})
    wait_pending(sstack, job.request_id)
    text = statement(sstack, job.request_id)
    forged = carry(sstack, job.request_id, sign(keys, "agent", text))
    assert forged["ok"] is False and forged["error"]["code"] == "signature_wrong_key"  # type: ignore[index]
    # Naming the principal is an operator's option only: on the agent door it would reveal which exist.
    claimed = carry(sstack, job.request_id, sign(keys, "agent", text), principal="alice")
    assert claimed["error"]["code"] == "invalid_arguments" and claimed["error"]["details"]["field"] == "principal"  # type: ignore[index]
    assert refusals(sstack, job.request_id) == ["signature_wrong_key"]
    assert not marker.exists() and wait_pending(sstack, job.request_id)
    # Control: alice's genuine signature through the same door runs it.
    assert carry(sstack, job.request_id, sign(keys, "alice", text))["ok"] is True
    assert job.result()["ok"] is True and marker.exists()


def test_a_tampered_signature_is_refused(sstack: Stack, keys: Path, tmp_path: Path) -> None:
    marker = tmp_path / "tampered"
    job = Background(sstack, {"argv": ["touch", str(marker)]})
    wait_pending(sstack, job.request_id)
    genuine = sign(keys, "alice", statement(sstack, job.request_id))
    lines = genuine.strip().splitlines()
    blob = bytearray(base64.b64decode("".join(lines[1:-1])))
    blob[-5] ^= 0x01  # one bit of the ed25519 signature itself
    tampered = "\n".join([lines[0], base64.b64encode(bytes(blob)).decode(), lines[-1]]) + "\n"
    reply = carry(sstack, job.request_id, tampered)
    assert reply["error"]["code"] == "signature_invalid"  # type: ignore[index]
    assert not marker.exists() and wait_pending(sstack, job.request_id)
    assert carry(sstack, job.request_id, genuine)["ok"] is True  # control
    assert job.result()["ok"] is True and marker.exists()


def test_a_signature_cannot_be_moved_to_another_request_or_replayed(sstack: Stack, keys: Path, tmp_path: Path) -> None:
    wanted, harmless = tmp_path / "wanted", tmp_path / "harmless"
    innocent = Background(sstack, {"argv": ["touch", str(harmless)]})
    evil = Background(sstack, {"argv": ["touch", str(wanted)]})
    wait_pending(sstack, innocent.request_id)
    wait_pending(sstack, evil.request_id)
    approved = sign(keys, "alice", statement(sstack, innocent.request_id))
    moved = carry(sstack, evil.request_id, approved)
    assert moved["error"]["code"] == "signature_other_request"  # type: ignore[index]
    assert not wanted.exists()
    # Control: it is good for the request it signs.
    assert carry(sstack, innocent.request_id, approved)["ok"] is True
    assert innocent.result()["ok"] is True and harmless.exists()
    # Used once: replayed on the other request, or the same request ID asked again, it is refused.
    assert carry(sstack, evil.request_id, approved)["error"]["code"] == "signature_replayed"  # type: ignore[index]
    again = Background(sstack, {"argv": ["touch", str(wanted)]}, id=innocent.request_id + "-again")
    wait_pending(sstack, again.request_id)
    assert carry(sstack, again.request_id, approved)["error"]["code"] == "signature_replayed"  # type: ignore[index]
    assert not wanted.exists()
    # `again` is evil's identical twin, attached to it (issue 34): one deny decides both.
    assert sstack.native("deny", {"id": evil.request_id}, path=sstack.operator)["ok"] is True
    for job in (evil, again):
        assert job.result()["error"]["code"] == "denied"
    assert not wanted.exists()
