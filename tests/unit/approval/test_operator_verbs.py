"""The operator door serves exactly its declared verbs (common.wire.operator), which intake refuses to agents;
each verb refuses a caller its declaration does not name, before it reads an argument."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from airlock.approval import service as approval_service
from airlock.common.codec import Request
from airlock.common.config import load
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.common.server import Call, Service
from airlock.common.wire import operator as door
from airlock.common.wire.operator import VERBS as OPERATOR_VERBS
from airlock.common.wire.verb import Caller


def _service(tmp_path: Path, extra: str = "") -> Service:
    config_file = tmp_path / "airlock.yaml"
    config_file.write_text(f"paths:\n  runtime_dir: {tmp_path}\n  policy_dir: {tmp_path / 'policy.d'}\n{extra}")
    service: Service = asyncio.run(approval_service.build(load(config_file), {}))
    return service


def test_the_operator_door_serves_exactly_the_listed_verbs(tmp_path: Path) -> None:
    service = _service(tmp_path)
    served = set(service.doors["operator"].verbs)
    # A verb added to the door but not to the list would answer an agent's probe at the agent
    # door with `unknown_verb` instead of `unauthorized`; one listed but not served is stale.
    assert served == set(OPERATOR_VERBS)
    assert not set(service.doors["approval"].verbs) & OPERATOR_VERBS


def _peer(user: str) -> Peer:
    entry = pwd.getpwnam(user)
    return Peer(os.getpid(), entry.pw_uid, entry.pw_gid, user, (entry.pw_gid,), frozenset({user}))


def _call(service: Service, verb: str, peer: Peer, args: dict[str, Any], token: str | None = None) -> Any:
    request = Request("t", verb, args, token)
    return asyncio.run(service.doors["operator"].verbs[verb](Call(request, peer, None)))  # type: ignore[arg-type]


@pytest.mark.parametrize("verb", sorted(OPERATOR_VERBS - door.OBSERVER_VERBS))
def test_an_observer_is_refused_every_verb_that_changes_something(tmp_path: Path, verb: str) -> None:
    service = _service(tmp_path, "operators:\n  observers:\n    users: [nobody]\n")
    with pytest.raises(AirlockError) as refused:
        _call(service, verb, _peer("nobody"), {"bogus": object()})  # refused before its arguments are read
    assert refused.value.code is ErrorCode.UNAUTHORIZED
    assert refused.value.message == "observers may only read (status, pending, show, events)"


def test_web_is_an_observer_that_carries_the_passkey_verbs() -> None:
    assert door.PASSKEY_VERBS <= door.OBSERVER_VERBS
    assert all(Caller.WEB in v.callers for v in (door.PASSKEY_DECIDE, door.PASSKEY_LOGIN_BEGIN, door.PASSKEY_LIST))
    # Issue 49: passkey.import is root's (a line decides whose votes a passkey makes), never carried by the web.
    assert door.PASSKEY_VERBS == {name for name in door.VERBS if name.startswith("passkey.")} - {"passkey.import"}
    assert door.PASSKEY_IMPORT.callers == {Caller.OPERATOR}
    assert not any(Caller.WEB in v.callers for v in (door.APPROVE, door.DENY, door.HOLD, door.TOKEN_ISSUE))


def test_a_token_is_refused_on_the_operator_door_and_a_verb_without_arguments_takes_none(tmp_path: Path) -> None:
    service = _service(tmp_path)
    root = Peer(os.getpid(), 0, 0, "root", (0,), frozenset({"root"}))
    with pytest.raises(AirlockError) as refused:
        _call(service, "pending", root, {}, token="alt_anything")
    assert refused.value.code is ErrorCode.UNAUTHORIZED
    with pytest.raises(AirlockError) as refused:
        _call(service, "pending", root, {"limit": 5})
    assert refused.value.code is ErrorCode.INVALID_ARGUMENTS and refused.value.details["field"] == "limit"
    assert _call(service, "pending", root, {}) == {"pending": []}
