"""runner.sock as declared (issue 36): exactly wire/runner's verbs, each for its declared callers only,
and a line long enough for the largest request intake accepts with what approval binds to it."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import time
import uuid
from typing import Any

import pytest

from airlock.common import config as configuration
from airlock.common.codec import Request, iso_utc
from airlock.common.config import Config
from airlock.common.errors import AirlockError
from airlock.common.peer import identify
from airlock.common.server import Call, Door
from airlock.common.wire import runner as wire
from airlock.common.wire.verb import declared
from airlock.intake.request import native_exec
from airlock.intake.work import exec_work
from airlock.runner.fileop_verbs import FileVerbs
from airlock.runner.passkeys import PasskeyWriter
from airlock.runner.service import Runner

ME = os.getuid()
APPROVAL_ONLY = {"kill", "running", "inspect", "review", "output", "files_preview", "passkeys.write"}
INTAKE_ONLY = {"exec", "files"}


def _config(intake: int, approval: int) -> Config:
    defaults = configuration.defaults()
    services = dataclasses.replace(defaults.services, intake_user=str(intake), approval_user=str(approval))
    return dataclasses.replace(defaults, services=services)


def _door(cfg: Config) -> Door:
    runner = Runner(cfg)
    return runner.door(FileVerbs(runner), PasskeyWriter(cfg))


def _code(door: Door, verb: str) -> str:
    """What ``verb`` answers this process (empty arguments: a caller it admits gets invalid_arguments)."""
    me = identify(os.getpid(), ME, os.getgid())

    async def served() -> dict[str, Any]:
        return await door.verbs[verb](Call(Request(id="r", verb=verb, args={}), me, None))  # type: ignore[arg-type]

    with pytest.raises(AirlockError) as caught:
        asyncio.run(served())
    return caught.value.code.value


def test_the_door_serves_exactly_the_declared_verbs() -> None:
    door = _door(_config(ME, ME))
    assert set(door.verbs) == set(declared(wire.DOOR)) == APPROVAL_ONLY | INTAKE_ONLY | {"cancel"}


def test_intake_reaches_only_exec_files_and_cancel() -> None:
    """An intake that is not approval cannot reach approval's verbs: files_preview would show it, as
    root, the diff of a file it cannot read; kill, output and passkeys.write are operators' through approval."""
    door = _door(_config(intake=ME, approval=ME + 1))
    for verb in APPROVAL_ONLY:
        assert _code(door, verb) == "unauthorized", verb
    for verb in INTAKE_ONLY | {"cancel"}:  # control: admitted, then refused for its (empty) arguments
        assert _code(door, verb) == "invalid_arguments", verb


def test_approval_cannot_ask_for_work() -> None:
    door = _door(_config(intake=ME + 1, approval=ME))
    for verb in INTAKE_ONLY:
        assert _code(door, verb) == "unauthorized", verb
    for verb in APPROVAL_ONLY - {"running"} | {"cancel"}:
        assert _code(door, verb) == "invalid_arguments", verb


def test_a_stranger_reaches_nothing() -> None:
    door = _door(_config(intake=ME + 1, approval=ME + 2))
    for verb in door.verbs:
        assert _code(door, verb) == "unauthorized", verb


def _request_of(limit: int, stages: int) -> dict[str, Any]:
    """An exec request line of ``limit`` bytes exactly (filled with stdin), as an agent may send."""

    def line(n: int) -> dict[str, Any]:
        args = {
            "pipeline": [["cat"]] * stages,
            "privileged": False,
            "stdin": base64.b64encode(b"x" * n).decode(),
            "time": iso_utc(time.time()),
            "operation_id": "op-" + str(uuid.uuid4()),
        }
        return {"v": 1, "id": str(uuid.uuid4()), "verb": "exec", "args": args}

    n = 0
    for step in (3000, 3):
        while len(json.dumps(line(n + step))) + 1 <= limit:
            n += step
    return line(n)


@pytest.mark.parametrize("stages", [1, 8, 64])
def test_the_largest_request_fits_the_runner_line_with_what_approval_binds(stages: int) -> None:
    cfg = configuration.defaults()
    limit = cfg.limits.max_request_bytes
    peer = identify(os.getpid(), ME, os.getgid())
    request = _request_of(limit, stages)
    work = exec_work(native_exec(request["id"], request["args"], peer, cfg, time.time()), peer, cfg)
    binary = {"path": "/usr/bin/cat", "dev": 2049, "ino": 2**40, "size": 44016, "mode": 33261, "uid": 0, "gid": 0}
    bound = {"binaries": [binary | {"sha256": "0" * 64}] * stages, "arguments": [], "credentials": []}
    args = wire.approved(work.runner_args, ticket="t" * 43, bound=bound, operation_id=work.operation_id, after=[])
    line = len(json.dumps({"v": 1, "id": str(uuid.uuid4()), "verb": "exec", "args": args.to_dict()})) + 1
    assert line > limit  # what approval binds comes on top of the request: a line of the request's limit is short
    assert line <= wire.max_line(limit)
