"""reference/000 wording that clients match on, checked without a socket."""

from __future__ import annotations

import time

import pytest

from airlock.common import config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.intake.request import legacy_exec

PEER = Peer(pid=1, uid=0, gid=0, user="root", group_ids=(0,), groups=frozenset({"root"}))


@pytest.mark.parametrize("pipeline", [[], None])
def test_an_empty_or_missing_pipeline_says_pipeline_must_not_be_empty(pipeline: list[list[str]] | None) -> None:
    # reference/000: "rejects the empty pipeline at validation ... with "pipeline must not be empty"".
    obj = {"id": "x", "time": "2026-01-01T00:00:00Z"} | ({} if pipeline is None else {"pipeline": pipeline})
    with pytest.raises(AirlockError) as err:
        legacy_exec(obj, PEER, config.defaults(), time.time())
    assert err.value.code is ErrorCode.INVALID_ARGUMENTS
    assert err.value.message == "pipeline must not be empty"
    assert err.value.details == {"field": "pipeline"}
