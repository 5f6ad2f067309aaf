"""Everything a ticket binds is shown to a person somewhere (issue 45): a walk over the bound fields.

The fields are read from the code that builds the ticket: the keys of
``ExecSpec.to_dict`` (what ``ExecSpec.digest`` hashes) and every key decide
puts in ``bound`` (found in approval's source: ``bound["K"] = …`` and
``bound |= f(…)`` with the keys ``f`` returns), so a field added there
without a probe here fails.  Each probe changes one field to a value no
other field has and looks for it on the surfaces a person decides from:
`airlock watch`'s screen (what `pending` and `show` print too, from the same
`render` helpers), the relay's message, airlock-web's request page and the
statement a key or passkey signs.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import airlock.approval
from airlock.approval.asked import operator_view
from airlock.approval.pending import Pending, describe_binaries
from airlock.approval.promote import pending_payload
from airlock.approval.rules import Decision, StageDecision
from airlock.approval.signed import Published
from airlock.approval.votes import Votes
from airlock.cli.watch import describe
from airlock.common.peer import Peer
from airlock.common.render import Style
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire
from airlock.relay.message import pending_message
from airlock.web.pages import request_view
from airlock.web.sessions import Session

PEER = Peer(pid=7, uid=4242, gid=4242, user="walker", group_ids=(4242,), groups=frozenset({"walker"}))
BASE = ExecSpec(mode="exec", stages=(("/usr/bin/id", "-u"),), privileged=True, uid=4242)
BASE_BOUND: dict[str, Any] = {"binaries": [{"path": "/usr/bin/id", "dev": 1, "ino": 2, "uid": 0, "mode": 0o100755}]}


def _bound_keys() -> set[str]:
    """Every key approval's source puts in a ticket's ``bound``."""
    keys: set[str] = set()
    returned: dict[str, set[str]] = {}
    merged: set[str] = set()
    for path in Path(airlock.approval.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if (
                        isinstance(target, ast.Subscript)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "bound"
                        and isinstance(target.slice, ast.Constant)
                    ):
                        keys.add(str(target.slice.value))
            elif (
                isinstance(node, ast.AugAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == "bound"
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
            ):
                merged.add(node.value.func.id)
            elif isinstance(node, ast.FunctionDef):
                returned[node.name] = {
                    str(k.value)
                    for ret in ast.walk(node)
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict)
                    for k in ret.value.keys
                    if isinstance(k, ast.Constant)
                }
    for name in merged:
        assert returned.get(name), f"bound |= {name}(...): its keys are not a dict literal this walk can read"
        keys |= returned[name]
    return keys


def bound_fields() -> set[str]:
    return {f"spec.{k}" for k in BASE.to_dict()} | {f"bound.{k}" for k in _bound_keys()}


def _surfaces(spec: ExecSpec, bound: dict[str, Any]) -> dict[str, str]:
    """What a person reads of one pending command on each surface."""
    asking = wire.Asking(request_id="walk-1", reason="walking", session="s", host="h", time="2026-12-06T00:00:00Z")
    view = operator_view(asking, spec)
    stages = tuple(
        StageDecision(argv=stage, resolved=stage[0], decision="ask", rule="walk-rule") for stage in spec.stages
    )
    loop = asyncio.new_event_loop()
    entry = Pending(
        request_id="walk-1",
        operation_id="op-walk",
        peer=dataclasses.replace(PEER, uid=spec.uid),  # approval refuses a spec whose uid is not the peer's
        request=view,
        decision=Decision("ask", "walk-rule", stages),
        digest=spec.digest(),
        bound=bound,
        created=time.time(),
        expires=time.time() + 60,
        rule="walk-rule",
    )
    loop.close()
    entry.privileged, entry.run_as = spec.privileged, spec.run_as
    entry.run_as_user = "root" if spec.privileged else "walker"
    entry.stdin = spec.stdin
    entry.binaries = describe_binaries(entry.decision, spec.run_as, bound.get("binaries"))
    votes = SimpleNamespace(host="h", ledger=SimpleNamespace(signers=SimpleNamespace(enabled=lambda: True)))
    entry.published = Published("walk-1", Votes.statements(votes, entry))  # type: ignore[arg-type]
    now = time.time()
    item = entry.to_dict(now)
    payload = pending_payload(entry, 60.0, SimpleNamespace(pending_extra=lambda e: Votes.pending_extra(votes, e)))  # type: ignore[arg-type]
    event = {"seq": 1, "time": "2026-12-06T00:00:00Z", "request_id": "walk-1", "peer_uid": 4242, "payload": payload}
    relay = pending_message(event, "h", lambda uid: "walker", now)
    session = Session("alice", "operator", "cred", "csrf", "proof", now, now + 60)
    return {
        "watch": describe(item, Style(False), 1, 1),
        "relay": relay["text"],
        "web": str(request_view({"pending": True, "detail": item}, session, now)),
        "statement": entry.published.statements["allow"].render(),
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# field -> (a change to the base request, what a person must then read on some surface)
Change = Callable[[ExecSpec, dict[str, Any]], tuple[ExecSpec, dict[str, Any]]]


def _spec(**changes: Any) -> Change:
    return lambda spec, bound: (dataclasses.replace(spec, **changes), bound)


def _bound(key: str, value: Any) -> Change:
    return lambda spec, bound: (spec, bound | {key: value})


PROBES: dict[str, tuple[Change, str]] = {
    "spec.mode": (_spec(mode="shell", stages=(("/bin/sh", "-c", "walk-shell-line"),)), "/bin/sh -c walk-shell-line"),
    "spec.stages": (_spec(stages=(("/usr/bin/id", "walk-argument"),)), "walk-argument"),
    "spec.privileged": (_spec(privileged=False), "walker (unprivileged)"),
    "spec.uid": (_spec(uid=4343), "uid 4343"),  # the requester (and whom an unprivileged job runs as)
    "spec.env": (_spec(env={"WALK_NAME": "walk-env-value"}), "WALK_NAME=walk-env-value"),
    "spec.protected_names": (_spec(protected_names=("WALK_SECRET",)), "WALK_SECRET"),
    "spec.cwd": (_spec(cwd="/walk/cwd"), "/walk/cwd"),
    "spec.stdin": (_spec(stdin=_b64("walk-stdin\n")), "11 bytes, sha256 "),
    "spec.timeout_ms": (_spec(timeout_ms=77123), "77123"),
    "spec.deadline_ms": (_spec(deadline_ms=88123), "88123"),
    "spec.max_output_bytes": (_spec(max_output_bytes=99123), "99123"),
    "spec.forward_agent": (_spec(privileged=False, forward_agent=True), "forwarded to the job"),
    "bound.binaries": (
        _bound("binaries", [{"path": "/usr/bin/id", "dev": 1, "ino": 918273, "uid": 0, "mode": 0o100755}]),
        "918273",
    ),
    "bound.sandbox": (_bound("sandbox", [{"private_tmp": "walk-sandbox"}]), "private_tmp=walk-sandbox"),
    "bound.credentials": (_bound("credentials", [{"walk-credential": "/etc/walk"}]), "walk-credential"),
    "bound.arguments": (
        _bound("arguments", [{"stage": 0, "index": 1, "path": "/walk/argument", "kind": "file", "sha256": "ab" * 32}]),
        "/walk/argument",
    ),
}
# A file operation's reviewed content (bound.file) is shown by its own view (fileop_review, issue 39):
# walked in test_fileop_review's "against sha256" tests, not here, where every request is a command.
FILE_ONLY = {"bound.file"}


def test_every_bound_field_is_read_from_the_code_and_has_a_probe() -> None:
    fields = bound_fields()
    assert {"spec.cwd", "spec.stdin", "bound.binaries", "bound.credentials"} <= fields  # the walk reads the code
    missing = fields - PROBES.keys() - FILE_ONLY
    assert not missing, f"bound to a ticket but never checked to be shown: {sorted(missing)}"


@pytest.mark.parametrize("field", sorted(PROBES))
def test_a_bound_field_is_shown_on_some_surface(field: str) -> None:
    change, expected = PROBES[field]
    before = _surfaces(BASE, dict(BASE_BOUND))
    assert not any(expected in text for text in before.values()), f"{field}: the probe's text is there already"
    after = _surfaces(*change(BASE, dict(BASE_BOUND)))
    shown_on = sorted(name for name, text in after.items() if expected in text)
    assert shown_on, f"{field} is bound to the ticket but shown on no surface: {after}"


def test_cwd_and_stdin_are_on_every_surface_a_person_decides_from() -> None:
    spec = dataclasses.replace(BASE, cwd="/etc", stdin=_b64("root:walk-password\n"))
    surfaces = _surfaces(spec, dict(BASE_BOUND))
    for name, text in surfaces.items():
        assert "/etc" in text and "19 bytes, sha256 " in text, (name, text)
    # The bytes themselves: operators' surfaces (watch, web) only; never the relay.
    assert "root:walk-password" in surfaces["watch"] and "root:walk-password" in surfaces["web"]
    assert "root:walk-password" not in surfaces["relay"] and "root:walk-password" not in surfaces["statement"]
