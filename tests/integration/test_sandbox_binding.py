"""A rule's sandbox (issue 22) travels with the ticket and is never dropped.

`dev up` runs jobs as process groups (no systemd here), where no sandbox can
be applied: a job whose rule has one is refused before anything runs rather
than run unconfined.  The operator sees the sandbox of a pending request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Background, Stack, custom_stack, wait_pending

CONFIG = """
approval:
  timeout_seconds: 10
policy:
  default: deny
  rules:
    - name: confined-touch
      decision: allow
      privileged: false
      commands: [[/usr/bin/touch, "..."]]
      sandbox: {read_only: true, private_network: true}
    - name: plain-echo
      decision: allow
      privileged: false
      commands: [[/usr/bin/echo, "..."]]
    - name: ask-confined-cat
      decision: ask
      privileged: false
      commands: [[/usr/bin/cat, "..."]]
      sandbox: {private_tmp: true}
"""


@pytest.fixture(scope="module")
def sstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("sb")), CONFIG) as s:
        yield s


def test_a_sandboxed_rule_is_refused_where_no_sandbox_can_be_applied(sstack: Stack, tmp_path: Path) -> None:
    assert sstack.exec({"argv": ["echo", "hi"], "privileged": False})["ok"] is True  # the control
    marker = tmp_path / "touched"
    reply = sstack.exec({"argv": ["touch", str(marker)], "privileged": False})
    assert reply["ok"] is False and reply["error"]["code"] == "spawn_failed", reply
    assert "sandbox" in reply["error"]["message"] and "service" in reply["error"]["message"]
    assert not marker.exists()
    refused = [r for r in sstack.journal_rows() if r["kind"] == "exec.refused"]
    assert refused, "the refusal is journaled"


def test_the_operator_sees_the_sandbox_of_a_pending_request(sstack: Stack) -> None:
    job = Background(sstack, {"argv": ["cat", "/etc/hostname"], "privileged": False})
    wait_pending(sstack, job.request_id)
    shown = sstack.cli("pending")
    assert shown.returncode == 0, shown.stderr
    assert "sandbox: stage 1: private_tmp=True" in shown.stdout, shown.stdout
    check = sstack.cli("policy", "check", "--no-privilege", "--", "/usr/bin/echo", "x")
    assert "sandbox: none (a full job, as with sudo)" in check.stdout, check.stdout
    assert sstack.cli("deny", job.request_id).returncode == 0
    assert job.result()["ok"] is False
