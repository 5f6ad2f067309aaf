"""make stress: fixtures and the summary.  Shared code lives in stress_support.

The stack helpers come from tests/support.py, imported by that name so no
conftest.py shadows another.
"""

from __future__ import annotations

import pytest

from stress_support import Tally, stress_n

_TALLY = pytest.StashKey[Tally]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Long loads need long timeouts; a hang is still caught, just not at 300 s.
    budget = 300 + stress_n() * 0.1
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(budget))


@pytest.fixture(scope="session")
def tally(pytestconfig: pytest.Config) -> Tally:
    found = pytestconfig.stash.get(_TALLY, None)
    if found is None:
        found = Tally()
        pytestconfig.stash[_TALLY] = found
    return found


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    found = config.stash.get(_TALLY, None)
    if found is not None and found.rows:
        terminalreporter.section("airlock stress summary (lost and unaudited must be 0)")
        terminalreporter.write_line(found.render())
