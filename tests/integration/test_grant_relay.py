"""Issue 34: the relay tells operators when a grant ends (its time is up, or its uses are used up), and sends
one question, not two, for identical requests pending at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from notify_receivers import HttpReceiver

from support import Background, Stack, custom_stack, wait_pending
from waits import until


@pytest.fixture
def http() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    if receiver.server is not None:
        receiver.down()


@pytest.fixture
def stack(http: HttpReceiver, tmp_path: Path) -> Iterator[Stack]:
    config = (
        "approval: {timeout_seconds: 30}\npolicy: {default: ask}\n"
        "notify:\n  host: testhost\n  poll_seconds: 0.2\n  backoff_max_seconds: 2\n  rate_per_minute: 600\n"
        "  channels:\n"
        f"    - {{type: webhook, name: hook, url: '{http.url('/hook')}', secret: relay-test-secret-0123456789}}\n"
    )
    with custom_stack(tmp_path / "run", config) as s:
        yield s


def granted(stack: Stack, argv: list[str], *flags: str) -> str:
    job = Background(stack, {"argv": argv})
    wait_pending(stack, job.request_id)
    assert stack.cli("approve", "-y", job.request_id, *flags).returncode == 0
    assert job.result()["ok"] is True
    return str(
        next(
            g["grant_id"]
            for g in stack.native("grants", path=stack.operator)["data"]["grants"]
            if g["request_id"] == job.request_id
        )
    )


def grant_posts(http: HttpReceiver, grant_id: str) -> list[dict[str, Any]]:
    out = []
    for post in http.on("/hook"):
        body: dict[str, Any] = post.json()
        if body.get("event") == "grant" and body.get("grant_id") == grant_id:
            out.append(body)
    return out


def test_the_relay_announces_a_grant_used_up_and_one_expired(stack: Stack, http: HttpReceiver, tmp_path: Path) -> None:
    used = granted(stack, ["touch", str(tmp_path / "u")], "--grant", "30m", "--uses", "1")
    assert stack.exec({"argv": ["touch", str(tmp_path / "u")], "privileged": False})["ok"] is True
    post = http.wait("/hook", lambda p: p.json().get("grant_id") == used, timeout=20).json()
    assert post["ended"] == "used up" and post["used"] == 1 and post["uses"] == 1
    assert post["title"] == f"airlock: grant {used} used up on testhost"
    short = granted(stack, ["touch", str(tmp_path / "e")], "--grant", "2s")
    post = http.wait("/hook", lambda p: p.json().get("grant_id") == short, timeout=20).json()
    assert post["ended"] == "expired" and f"touch {tmp_path / 'e'}" in post["text"]
    # A revoke is the operator's own act: no message.
    revoked = granted(stack, ["touch", str(tmp_path / "r")], "--grant", "30m")
    assert stack.cli("grants", "revoke", revoked).returncode == 0
    marker = granted(stack, ["touch", str(tmp_path / "m")], "--grant", "1s")  # a later grant's end
    http.wait("/hook", lambda p: p.json().get("grant_id") == marker, timeout=20)
    assert grant_posts(http, revoked) == [] and len(grant_posts(http, used)) == 1


def test_identical_requests_pending_at_once_are_one_message(stack: Stack, http: HttpReceiver, tmp_path: Path) -> None:
    first = Background(stack, {"argv": ["touch", str(tmp_path / "t")]})
    wait_pending(stack, first.request_id)
    second = Background(stack, {"argv": ["touch", str(tmp_path / "t")]})
    until("the second request attached to the first", lambda: wait_pending(stack, first.request_id).get("attached"))
    http.wait("/hook", lambda p: p.json().get("request_id") == first.request_id, timeout=20)
    assert stack.cli("approve", "-y", first.request_id).returncode == 0
    assert first.result()["ok"] is True and second.result()["ok"] is True
    http.wait(
        "/hook",
        lambda p: p.json().get("request_id") == first.request_id and p.json().get("event") == "decided",
        timeout=20,
    )
    # A later request's message shows the relay read past both; none was about the second.
    later = Background(stack, {"argv": ["touch", str(tmp_path / "later")]})
    http.wait("/hook", lambda p: p.json().get("request_id") == later.request_id, timeout=20)
    assert stack.cli("deny", later.request_id).returncode == 0
    assert [p for p in http.on("/hook") if p.json().get("request_id") == second.request_id] == []
