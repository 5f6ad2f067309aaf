"""One live stack for the sudo-proxy conformance suite, set up the way the peer's tests set up their daemon.

The peer's tests shorten two clocks with knobs (``SUDO_PROXY_EXEC_TIMEOUT_SECS=1``
and a scripted prompter that times out); airlock's equivalents are settings:
``limits.default_timeout_seconds`` (a job without its own timeout) and
``approval.timeout_seconds`` (nobody decided).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Stack, custom_stack

CONFIG = """
limits:
  default_timeout_seconds: 2
approval:
  timeout_seconds: 4
"""


@pytest.fixture(scope="module")
def peer_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    runtime = Path(tmp_path_factory.mktemp("cf")) / "rt"
    with custom_stack(runtime, CONFIG) as stack:
        yield stack
