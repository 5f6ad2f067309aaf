"""One agent cannot keep another's request from operators (issue 28, item 3).

The attack: an agent asks and withdraws in a tight loop (150 cycles).  Each
cycle used to cost every channel two messages, sent in journal order at the
channel's rate (30 a minute), so another agent's request, asked after the
flood, reached nobody before its approval timeout.

Now asking is bounded per agent (``approval.asks_per_minute``,
``approval.max_pending_per_agent``: ``rate_limited``), a message for a request
that settled before it went out is dropped (withdrawn) or collapsed into its
outcome, and each channel serves agents in turn.  The victim, a second real
user, must reach the receiver within seconds.  The control shows the flood is
real: it ran its 150 cycles, most were refused ``rate_limited``, and the
receiver got far fewer of its messages than it asked for.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from secsupport import agent_request, as_user, needs_root, red_stack, throwaway_user

from notify_receivers import HttpReceiver

from support import Stack, wait_pending

pytestmark = needs_root

CYCLES = 150
SECRET = "flood-test-secret-0123456789"

# Run as the flooding agent with the system python: ask, wait until it is pending (or refused),
# hang up (which withdraws it), again.  Prints how each cycle ended.
_FLOOD = r"""
import json, socket, sys, uuid
from datetime import datetime, timezone
job = json.load(sys.stdin)
outcomes = {}
for i in range(job["cycles"]):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(job["socket"])
    now = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    request = {"v": 1, "id": f"flood-{i}-{uuid.uuid4().hex[:8]}", "verb": "exec",
               "args": {"time": now, "argv": ["/usr/bin/true"], "privileged": False, "stream": True,
                        "operation_id": f"flood-op-{uuid.uuid4().hex}"}}
    s.sendall(json.dumps(request).encode() + b"\n")
    buf, end = b"", "eof"
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        lines = buf.split(b"\n")
        buf = lines.pop()
        done = False
        for line in lines:
            message = json.loads(line)
            if message.get("event") == "pending_approval":
                end, done = "pending", True
            elif "event" not in message:
                end, done = (message.get("error") or {}).get("code", "ok"), True
            if done:
                break
        if done:
            break
    s.close()  # withdraws a pending request
    outcomes[end] = outcomes.get(end, 0) + 1
print(json.dumps(outcomes))
"""


def _config(http: HttpReceiver, users: list[str]) -> str:
    return (
        f"agents: {{users: [{', '.join(users)}]}}\n"
        "approval: {timeout_seconds: 90}\n"
        "policy: {default: ask}\n"
        # The shipped channel rate (30 a minute): what made the flood take minutes to drain.
        "notify:\n  host: testhost\n  poll_seconds: 0.2\n  channels:\n"
        f"    - {{type: webhook, name: hook, url: '{http.url('/hook')}', secret: {SECRET}}}\n"
    )


@pytest.fixture
def http() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    if receiver.server is not None:
        receiver.down()


def _flood(stack: Stack, user: object, cycles: int) -> dict[str, int]:
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _FLOOD],
        input=json.dumps({"socket": stack.agent, "cycles": cycles}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **as_user(user),  # type: ignore[arg-type]
    )
    assert done.returncode == 0, done.stderr
    outcomes: dict[str, int] = json.loads(done.stdout)
    return outcomes


def test_a_flooding_agent_cannot_keep_another_agents_request_from_operators(http: HttpReceiver) -> None:
    with throwaway_user("alflood") as flooder, throwaway_user("alvictim") as victim:
        with red_stack(_config(http, [flooder.pw_name, victim.pw_name])) as stack:
            started = time.monotonic()
            outcomes = _flood(stack, flooder, CYCLES)
            flood_seconds = time.monotonic() - started

            # The victim asks once, right after the flood, and waits on its connection.
            request_id = f"victim-{uuid.uuid4()}"
            proc = agent_request(
                stack.agent,
                victim,
                "exec",
                {"argv": ["/usr/bin/true"], "privileged": False, "operation_id": f"op-{uuid.uuid4()}"},
                request_id=request_id,
                timeout=120,
            )
            try:
                wait_pending(stack, request_id)
                asked = time.time()
                post = http.wait(
                    "/hook",
                    lambda p: p.json()["request_id"] == request_id and p.json()["event"] == "pending",
                    timeout=30,
                )
                assert post.at - asked <= 5.0, f"the victim's request reached the receiver after {post.at - asked:.1f}s"
                assert stack.native("deny", {"id": request_id, "reason": "test over"}, path=stack.operator)["ok"]
            finally:
                proc.kill()
                proc.wait(30)

            # Control: the flood was real, and what held it back is the limits, not a slow agent.
            assert sum(outcomes.values()) == CYCLES and flood_seconds < 60, (outcomes, flood_seconds)
            assert outcomes.get("pending", 0) <= 20, outcomes  # approval.asks_per_minute (shipped: 20)
            assert outcomes.get("rate_limited", 0) >= CYCLES - 20, outcomes
            flood_posts = [p for p in http.on("/hook") if p.json()["request_id"].startswith("flood-")]
            assert len(flood_posts) <= 2 * outcomes.get("pending", 0) < 2 * CYCLES, len(flood_posts)
            refused = [
                r
                for r in stack.journal_rows()
                if r["kind"] == "request.replied" and '"rate_limited"' in str(r["payload"])
            ]
            assert len(refused) == outcomes["rate_limited"]
            assert all(r["peer_uid"] == flooder.pw_uid for r in refused)


def test_one_agent_may_keep_only_so_many_requests_waiting(http: HttpReceiver, tmp_path: Path) -> None:
    with throwaway_user("alhold") as holder, throwaway_user("alother") as other:
        with red_stack(_config(http, [holder.pw_name, other.pw_name])) as stack:
            held = []
            try:
                for n in range(10):  # approval.max_pending_per_agent (shipped: 10)
                    rid = f"hold-{uuid.uuid4()}"
                    held.append(
                        agent_request(
                            stack.agent,
                            holder,
                            "exec",
                            # Ten different commands: identical ones would be one question (issue 34).
                            {
                                "argv": ["/usr/bin/true", str(n)],
                                "privileged": False,
                                "operation_id": f"op-{uuid.uuid4()}",
                            },
                            request_id=rid,
                            timeout=120,
                        )
                    )
                    wait_pending(stack, rid)
                one_more = _flood(stack, holder, 1)
                assert one_more == {"rate_limited": 1}, one_more
                # Another agent is not held to the first one's limit.
                rid = f"other-{uuid.uuid4()}"
                proc = agent_request(
                    stack.agent,
                    other,
                    "exec",
                    {"argv": ["/usr/bin/true"], "privileged": False, "operation_id": f"op-{uuid.uuid4()}"},
                    request_id=rid,
                    timeout=120,
                )
                held.append(proc)
                wait_pending(stack, rid)
            finally:
                for proc in held:
                    proc.kill()
                    proc.wait(30)
