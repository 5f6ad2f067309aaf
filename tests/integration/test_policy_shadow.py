"""Issue 34: ``mode: shadow`` rules on a live stack, and `airlock policy shadow`.

A shadow rule never decides: the request goes exactly as the live rules say.
What it would have decided is journaled on the real decision's record, and
`airlock policy shadow` counts, per shadow rule, the requests it matched and
how often it agrees and disagrees with what really happened.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Background, Stack, custom_stack, wait_pending

CONFIG = """
approval:
  timeout_seconds: 30
policy:
  default: ask
  rules:
    - name: touchy
      decision: allow
      privileged: false
      commands: [[/usr/bin/touch, "..."]]
    - name: try-no-touch
      decision: deny
      mode: shadow
      commands: [[/usr/bin/touch, "..."]]
    - name: try-mkdir
      decision: allow
      mode: shadow
      commands: [[/usr/bin/mkdir, "..."]]
"""


@pytest.fixture(scope="module")
def sstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("sh")), CONFIG) as s:
        yield s


def decide_by_operator(stack: Stack, argv: list[str], verb: str) -> dict[str, Any]:
    job = Background(stack, {"argv": argv})
    wait_pending(stack, job.request_id)
    reply = stack.native(verb, {"id": job.request_id, "reason": "shadow test"}, path=stack.operator)
    assert reply["ok"], reply
    job.thread.join(30)
    assert job.reply is not None
    return job.reply


def test_shadow_rules_never_decide_and_are_reported(sstack: Stack, tmp_path: Path) -> None:
    # The shadow deny does not stop the live allow: both touches run at once.
    for name in ("a", "b"):
        reply = sstack.exec(
            {
                "argv": ["/usr/bin/touch", str(tmp_path / name)],
                "privileged": False,
                "operation_id": f"op-{uuid.uuid4()}",
            }
        )
        assert reply["ok"] is True, reply
        assert (tmp_path / name).exists()
    # The shadow allow does not skip the operator: each mkdir still waits for one.
    assert decide_by_operator(sstack, ["/usr/bin/mkdir", str(tmp_path / "d1")], "approve")["ok"] is True
    assert decide_by_operator(sstack, ["/usr/bin/mkdir", str(tmp_path / "d2")], "approve")["ok"] is True
    assert decide_by_operator(sstack, ["/usr/bin/mkdir", str(tmp_path / "d3")], "deny")["ok"] is False
    assert not (tmp_path / "d3").exists()
    # Neither rule matches this one: it counts nowhere.
    assert decide_by_operator(sstack, ["/usr/bin/true"], "deny")["ok"] is False

    done = sstack.cli("policy", "shadow", "--json", "--since", "1h")
    assert done.returncode == 0, done.stderr
    rows = {row["rule"]: row for row in json.loads(done.stdout)["rules"]}
    assert set(rows) == {"try-no-touch", "try-mkdir"}
    no_touch, mkdir = rows["try-no-touch"], rows["try-mkdir"]
    assert (no_touch["matched"], no_touch["agree"], no_touch["disagree"]) == (2, 0, 2)
    assert no_touch["outcomes"] == {"would deny": {"allowed": 2}}
    assert (mkdir["matched"], mkdir["agree"], mkdir["disagree"]) == (3, 2, 1)
    assert mkdir["outcomes"] == {"would allow": {"allowed": 2, "denied": 1}}
    assert [d["decision"] for d in mkdir["disagreements"]] == ["deny"]

    checked = sstack.cli("policy", "check", "--no-privilege", "--", "/usr/bin/mkdir", "x")
    assert checked.returncode == 0, checked.stderr
    assert "decision: ask (rule default)" in checked.stdout
    assert "shadow rule try-mkdir would decide: allow" in checked.stdout

    text = sstack.cli("policy", "shadow")
    assert text.returncode == 0, text.stderr
    assert "try-mkdir" in text.stdout
    assert "would allow: allowed 2, denied 1" in text.stdout
