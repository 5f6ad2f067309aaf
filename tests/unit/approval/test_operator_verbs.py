"""The operator door serves exactly its declared verbs (common.wire.operator), which intake refuses to agents."""

from __future__ import annotations

import asyncio
from pathlib import Path

from airlock.approval import service as approval_service
from airlock.common.config import load
from airlock.common.wire.operator import VERBS as OPERATOR_VERBS


def test_the_operator_door_serves_exactly_the_listed_verbs(tmp_path: Path) -> None:
    config_file = tmp_path / "airlock.yaml"
    config_file.write_text(f"paths:\n  runtime_dir: {tmp_path}\n  policy_dir: {tmp_path / 'policy.d'}\n")
    service = asyncio.run(approval_service.build(load(config_file), {}))
    served = set(service.doors["operator"].verbs)
    # A verb added to the door but not to the list would answer an agent's probe at the agent
    # door with `unknown_verb` instead of `unauthorized`; one listed but not served is stale.
    assert served == set(OPERATOR_VERBS)
    assert not set(service.doors["approval"].verbs) & OPERATOR_VERBS
