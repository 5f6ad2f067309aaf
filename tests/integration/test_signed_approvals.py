"""Issue 18: signed approvals (real `ssh-keygen -Y` ed25519 keys), quorum and reasons on a live stack.

Every bad signature is refused with its own code, is journaled, and runs nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import Background, Stack, custom_stack, wait_pending

pytestmark = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed (openssh-client)"
)


@dataclass
class Keys:
    folder: Path
    allowed: Path

    def key(self, name: str) -> Path:
        return self.folder / name

    def sign(self, name: str, text: str, namespace: str = "airlock-approval") -> str:
        done = subprocess.run(
            ["ssh-keygen", "-Y", "sign", "-n", namespace, "-f", str(self.key(name))],
            input=text.encode(),
            capture_output=True,
            check=True,
            timeout=30,
        )
        return done.stdout.decode()

    def fingerprint(self, name: str) -> str:
        out = subprocess.run(["ssh-keygen", "-lf", f"{self.key(name)}.pub"], capture_output=True, text=True, check=True)
        return out.stdout.split()[1]


def make_keys(folder: Path) -> Keys:
    """alice, bob and alice2 (a second key of alice's) are allowed signers; mallory is not."""
    lines = []
    for name in ("alice", "alice2", "bob", "mallory"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(folder / name)], check=True
        )
        pub = (folder / f"{name}.pub").read_text().split()
        if name != "mallory":
            lines.append(f"{name.rstrip('2')} {pub[0]} {pub[1]}")
    allowed = folder / "allowed_signers"
    allowed.write_text("# test signers\n" + "\n".join(lines) + "\n")
    return Keys(folder, allowed)


def config(allowed: Path, timeout: int) -> str:
    # Every signer is a person (issue 27): alice is the operator account daemon, bob is bin.
    return f"""
operators:
  users: [daemon, bin]
approval:
  timeout_seconds: {timeout}
  allowed_signers: {allowed}
  signer_accounts: {{alice: daemon, bob: bin}}
  min_reason_length: 12
policy:
  default: ask
  rules:
    - name: two-person
      decision: ask
      approvals: 2
      commands: [[/usr/bin/mkdir, "..."]]
    - name: say-why
      decision: allow
      reason: required
      privileged: false
      commands: [[/usr/bin/printf, "..."]]
"""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(Path(tmp_path_factory.mktemp("keys")))


@pytest.fixture(scope="module")
def sstack(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("sg")), config(keys.allowed, 60)) as s:
        yield s


def statement(stack: Stack, request_id: str, *extra: str) -> str:
    done = stack.cli("statement", request_id, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def submit(
    stack: Stack, request_id: str, signature: str, folder: Path, *extra: str, verb: str = "approve"
) -> subprocess.CompletedProcess[str]:
    path = folder / f"sig-{uuid.uuid4().hex[:8]}"
    path.write_text(signature)
    return stack.cli(verb, request_id, "--signature", str(path), *extra)


def actions(stack: Stack, request_id: str) -> list[dict[str, object]]:
    return [
        json.loads(r["payload"])
        for r in stack.journal_rows()
        if r["request_id"] == request_id and r["kind"] == "operator.action"
    ]


def test_a_valid_signature_runs_the_request_and_the_journal_names_the_signer(
    sstack: Stack, keys: Keys, tmp_path: Path
) -> None:
    marker = tmp_path / "signed"
    job = Background(sstack, {"argv": ["touch", str(marker)], "reason": "a file for the test"})
    shown = wait_pending(sstack, job.request_id)
    text = statement(sstack, job.request_id)
    assert text == shown["statement"] and f'request: "{job.request_id}"' in text and 'decision: "allow"' in text
    done = submit(sstack, job.request_id, keys.sign("alice", text), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "signed by alice" in done.stdout
    assert job.result()["ok"] is True and marker.exists()
    approve = [a for a in actions(sstack, job.request_id) if a["action"] == "approve"]
    assert approve and approve[0]["principal"] == "alice" and approve[0]["fingerprint"] == keys.fingerprint("alice")
    decided = [
        json.loads(r["payload"])
        for r in sstack.journal_rows()
        if r["request_id"] == job.request_id and r["kind"] == "approval.decided"
    ]
    assert decided[0]["approvers"][0]["principal"] == "alice"
    # The relay (airlock-notify) reads the statement from the journal's approval.pending record.
    pending = [
        json.loads(r["payload"])
        for r in sstack.journal_rows()
        if r["request_id"] == job.request_id and r["kind"] == "approval.pending"
    ]
    assert pending[0]["statement"] == text


def test_approve_sign_signs_locally_with_the_key_file(sstack: Stack, keys: Keys, tmp_path: Path) -> None:
    marker = tmp_path / "sign-flag"
    job = Background(sstack, {"argv": ["touch", str(marker)]})
    wait_pending(sstack, job.request_id)
    done = sstack.cli("approve", job.request_id, "--sign", str(keys.key("bob")))
    assert done.returncode == 0, done.stderr
    assert job.result()["ok"] is True and marker.exists()


def test_deny_sign_denies(sstack: Stack, keys: Keys, tmp_path: Path) -> None:
    marker = tmp_path / "deny-signed"
    job = Background(sstack, {"argv": ["touch", str(marker)]})
    wait_pending(sstack, job.request_id)
    done = sstack.cli("deny", job.request_id, "--sign", str(keys.key("bob")))
    assert done.returncode == 0, done.stderr
    reply = job.result()
    assert reply["error"]["code"] == "denied" and not marker.exists()


def _refused(stack: Stack, job: Background, done: subprocess.CompletedProcess[str], code: str, marker: Path) -> None:
    assert done.returncode == 1 and f"({code})" in done.stderr, done.stderr
    refused = [a for a in actions(stack, job.request_id) if a["action"] == "signature.refused"]
    assert refused and refused[-1]["code"] == code
    assert wait_pending(stack, job.request_id)  # still waiting: the refusal decided nothing
    assert stack.cli("deny", job.request_id).returncode == 0
    assert job.result()["error"]["code"] == "denied" and not marker.exists()


@pytest.mark.parametrize("case", ["wrong_key", "unknown_principal", "wrong_namespace", "tampered", "deny_for_approve"])
def test_a_bad_signature_is_refused_with_its_code_and_runs_nothing(
    sstack: Stack, keys: Keys, tmp_path: Path, case: str
) -> None:
    marker = tmp_path / case
    job = Background(sstack, {"argv": ["touch", str(marker)]})
    wait_pending(sstack, job.request_id)
    text = statement(sstack, job.request_id)
    extra: tuple[str, ...] = ()
    if case == "wrong_key":
        signature, code = keys.sign("mallory", text), "signature_wrong_key"
    elif case == "unknown_principal":
        signature, code, extra = keys.sign("alice", text), "signer_unknown", ("--principal", "carol")
    elif case == "wrong_namespace":
        signature, code = keys.sign("alice", text, namespace="git"), "signature_wrong_namespace"
    elif case == "tampered":
        signature, code = keys.sign("alice", text.replace("touch", "touch ")), "signature_invalid"
    else:
        signature, code = keys.sign("alice", statement(sstack, job.request_id, "--deny")), "signature_invalid"
    _refused(sstack, job, submit(sstack, job.request_id, signature, tmp_path, *extra), code, marker)


def test_a_signature_for_another_request_is_refused(sstack: Stack, keys: Keys, tmp_path: Path) -> None:
    first = Background(sstack, {"argv": ["touch", str(tmp_path / "first")]})
    second = Background(sstack, {"argv": ["touch", str(tmp_path / "second")]})
    wait_pending(sstack, first.request_id)
    wait_pending(sstack, second.request_id)
    signature = keys.sign("alice", statement(sstack, first.request_id))
    _refused(
        sstack,
        second,
        submit(sstack, second.request_id, signature, tmp_path),
        "signature_other_request",
        tmp_path / "second",
    )
    assert submit(sstack, first.request_id, signature, tmp_path).returncode == 0  # the control: it is good for its own
    assert first.result()["ok"] is True


def test_a_used_signature_cannot_be_replayed(sstack: Stack, keys: Keys, tmp_path: Path) -> None:
    job = Background(sstack, {"argv": ["touch", str(tmp_path / "once")]})
    wait_pending(sstack, job.request_id)
    signature = keys.sign("alice", statement(sstack, job.request_id))
    assert submit(sstack, job.request_id, signature, tmp_path).returncode == 0
    assert job.result()["ok"] is True
    again = submit(sstack, job.request_id, signature, tmp_path)
    assert again.returncode == 1 and "(signature_replayed)" in again.stderr
    # The same request ID asked again gets a fresh statement: the old signature is still a replay.
    marker = tmp_path / "twice"
    retry = Background(sstack, {"argv": ["touch", str(marker)]})
    wait_pending(sstack, retry.request_id)
    _refused(sstack, retry, submit(sstack, retry.request_id, signature, tmp_path), "signature_replayed", marker)


def test_two_distinct_signers_are_needed_and_the_same_signer_counts_once(
    sstack: Stack, keys: Keys, tmp_path: Path
) -> None:
    target = tmp_path / "made-by-two"
    job = Background(sstack, {"argv": ["mkdir", str(target)]})
    wait_pending(sstack, job.request_id)
    text = statement(sstack, job.request_id)
    first = submit(sstack, job.request_id, keys.sign("alice", text), tmp_path)
    assert first.returncode == 0 and "1 of 2" in first.stdout, first.stdout + first.stderr
    shown = wait_pending(sstack, job.request_id)
    assert shown["quorum"]["progress"] == "1 of 2" and not target.exists()
    pending = sstack.cli("pending")
    assert "1 of 2" in pending.stdout, pending.stdout
    waiting = sstack.cli("show", job.request_id)
    assert "approvals: 1 of 2 (daemon (key alice))" in waiting.stdout, waiting.stdout
    # alice's second key is still alice: it does not count.
    twice = submit(sstack, job.request_id, keys.sign("alice2", text), tmp_path)
    assert twice.returncode == 1 and "already approved" in twice.stderr, twice.stderr
    replay = submit(sstack, job.request_id, keys.sign("alice", text), tmp_path)
    assert replay.returncode == 1 and "(signature_replayed)" in replay.stderr
    assert wait_pending(sstack, job.request_id)["quorum"]["progress"] == "1 of 2"
    done = submit(sstack, job.request_id, keys.sign("bob", text), tmp_path)
    assert done.returncode == 0 and "2 of 2" in done.stdout
    assert job.result()["ok"] is True and target.is_dir()
    decided = [
        json.loads(r["payload"])
        for r in sstack.journal_rows()
        if r["request_id"] == job.request_id and r["kind"] == "approval.decided"
    ]
    assert [a["principal"] for a in decided[0]["approvers"]] == ["alice", "bob"]
    shown_text = sstack.cli("show", job.request_id).stdout
    assert (
        f"daemon (key alice {keys.fingerprint('alice')}), bin (key bob {keys.fingerprint('bob')}) [2 of 2]"
        in shown_text
    ), shown_text


def test_one_deny_denies_a_quorum_rule(sstack: Stack, keys: Keys, tmp_path: Path) -> None:
    target = tmp_path / "vetoed"
    job = Background(sstack, {"argv": ["mkdir", str(target)]})
    wait_pending(sstack, job.request_id)
    assert (
        submit(sstack, job.request_id, keys.sign("alice", statement(sstack, job.request_id)), tmp_path).returncode == 0
    )
    deny = submit(
        sstack, job.request_id, keys.sign("bob", statement(sstack, job.request_id, "--deny")), tmp_path, verb="deny"
    )
    assert deny.returncode == 0, deny.stderr
    assert job.result()["error"]["code"] == "denied" and not target.exists()


def test_an_agent_may_carry_a_signature_but_not_forge_one(sstack: Stack, keys: Keys, tmp_path: Path) -> None:
    marker = tmp_path / "carried"
    job = Background(sstack, {"argv": ["touch", str(marker)]})
    wait_pending(sstack, job.request_id)
    text = statement(sstack, job.request_id)
    forged = sstack.native("approve_signed", {"request_id": job.request_id, "signature": keys.sign("mallory", text)})
    assert forged["error"]["code"] == "signature_wrong_key"
    assert not marker.exists() and wait_pending(sstack, job.request_id)
    carried = sstack.native("approve_signed", {"request_id": job.request_id, "signature": keys.sign("bob", text)})
    assert carried["ok"] is True and carried["data"]["signer"]["principal"] == "bob"
    assert job.result()["ok"] is True and marker.exists()


def test_a_reason_required_rule_refuses_a_short_reason(sstack: Stack) -> None:
    short = sstack.exec({"argv": ["printf", "x"], "privileged": False, "reason": "   because   "})
    assert short["error"]["code"] == "reason_required" and short["error"]["details"]["rule"] == "say-why"
    none = sstack.exec({"argv": ["printf", "x"], "privileged": False})
    assert none["error"]["code"] == "reason_required"
    good = sstack.exec({"argv": ["printf", "x"], "privileged": False, "reason": "checking the printf path"})
    assert good["ok"] is True


def test_an_expired_statement_is_refused(tmp_path: Path, keys: Keys) -> None:
    with custom_stack(tmp_path / "ex", config(keys.allowed, 3)) as stack:
        marker = tmp_path / "late"
        job = Background(stack, {"argv": ["touch", str(marker)]})
        wait_pending(stack, job.request_id)
        signature = keys.sign("alice", statement(stack, job.request_id))
        assert job.result(timeout=30)["error"]["code"] == "approval_timeout"
        deadline = time.monotonic() + 10
        while stack.native("pending", path=stack.operator)["data"]["pending"] and time.monotonic() < deadline:
            time.sleep(0.1)
        late = submit(stack, job.request_id, signature, tmp_path)
        assert late.returncode == 1 and "(statement_expired)" in late.stderr, late.stderr
        assert not marker.exists()


def test_operator_reason_required_for_privileged_work(tmp_path: Path) -> None:
    text = (
        "approval:\n  timeout_seconds: 30\n  operator_reason: required\n  min_reason_length: 12\n"
        "policy:\n  default: ask\n"
    )
    with custom_stack(tmp_path / "or", text) as stack:
        marker = tmp_path / "root-made"
        job = Background(stack, {"argv": ["touch", str(marker)], "privileged": True})
        wait_pending(stack, job.request_id)
        for extra in ((), ("--reason", "   short    ")):
            refused = stack.cli("approve", job.request_id, *extra)
            assert refused.returncode == 1 and "(reason_required)" in refused.stderr, refused.stderr
        assert wait_pending(stack, job.request_id) and not marker.exists()
        assert stack.cli("approve", job.request_id, "--reason", "ticket OPS-1234 says so").returncode == 0
        assert job.result()["ok"] is True and marker.exists()
        approve = [a for a in actions(stack, job.request_id) if a["action"] == "approve"]
        assert approve[0]["reason"] == "ticket OPS-1234 says so"
        # Unprivileged work needs no operator reason.
        mine = Background(stack, {"argv": ["touch", str(tmp_path / "mine")], "privileged": False})
        wait_pending(stack, mine.request_id)
        assert stack.cli("approve", mine.request_id).returncode == 0
        assert mine.result()["ok"] is True


def test_a_signed_file_edit_names_the_file_and_runs(sstack: Stack, keys: Keys, tmp_path: Path) -> None:
    import threading

    from support import now_iso

    target = tmp_path / "site.conf"
    target.write_text("listen 80;\n")
    request_id = f"fe-{uuid.uuid4()}"
    reply: dict[str, object] = {}
    args = {"path": str(target), "old_text": "listen 80;", "new_text": "listen 8080;", "time": now_iso()}
    thread = threading.Thread(target=lambda: reply.update(sstack.native("files_edit", args, id=request_id)))
    thread.start()
    text = wait_pending(sstack, request_id)["statement"]
    assert f'command: "files_edit {target}"' in text
    done = submit(sstack, request_id, keys.sign("alice", text), tmp_path)
    assert done.returncode == 0, done.stderr
    thread.join(30)
    assert reply["ok"] is True and target.read_text() == "listen 8080;\n"
