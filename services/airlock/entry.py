"""The services' commands (pyproject's scripts), and ``python -m airlock.entry NAME`` for `airlock dev up`.

Each pauses Python's cycle collector before it loads its service: a start builds
a few hundred thousand objects (modules, classes, the typed protocol, the
config) that live as long as the process, and the collections they trigger
while loading are ~9% of a cold start's CPU (issue 50; `make bench-ab`'s cold
start rows). The service's READY (`common/notify.py`) moves what the start built
out of the collector's sight (`gc.freeze`) and resumes it. Imports nothing but
the standard library's ``gc``, ``importlib`` and ``sys``: it runs first.
"""

from __future__ import annotations

import gc
import importlib
import sys
from typing import NoReturn

# The command's name (without "airlock-") -> the module whose `main` it runs.
SERVICES = {
    "intake": "airlock.intake.wake",
    "approval": "airlock.approval.service",
    "runner": "airlock.runner.service",
    "exectree": "airlock.runner.exectree",
    "journal": "airlock.journal.service",
    "notify": "airlock.relay.service",
    "web": "airlock.web.service",
}


def _run(name: str) -> NoReturn:
    gc.disable()
    sys.exit(importlib.import_module(SERVICES[name]).main())


def intake() -> NoReturn:
    _run("intake")


def approval() -> NoReturn:
    _run("approval")


def runner() -> NoReturn:
    _run("runner")


def exectree() -> NoReturn:
    _run("exectree")


def journal() -> NoReturn:
    _run("journal")


def notify() -> NoReturn:
    _run("notify")


def web() -> NoReturn:
    _run("web")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in SERVICES:
        sys.exit(f"usage: python -m airlock.entry {{{','.join(SERVICES)}}} [ARGS...]")
    _run(sys.argv.pop(1))
