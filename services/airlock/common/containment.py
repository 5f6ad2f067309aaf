"""How a job is contained: the closed set of modes, in one registry.

``runner.containment`` names one of these or ``auto``; the runner resolves
``auto`` once per job (`resolve`), and everything after that (the job spec,
the journal's ``exec.started``, the reviewer, file operations) holds a
`Containment`, never a string.
"""

from __future__ import annotations

import enum
import os
from typing import Final


class Containment(enum.StrEnum):
    SERVICE = "service"
    SCOPE = "scope"
    PROCESS_GROUP = "process-group"

    @property
    def systemd(self) -> bool:
        """Whether systemd holds the job (a unit), so a rule's sandbox and credentials can apply."""
        return self is not Containment.PROCESS_GROUP

    @property
    def summary(self) -> str:
        return MODES[self]


# The one registry: every mode and what it gives a job (docs/configuration.md says the same).
MODES: Final[dict[Containment, str]] = {
    Containment.SERVICE: "each job stage a transient systemd unit outside the runner's sandbox: a scope, or a "
    "service when its rule's sandbox or credentials need one",
    Containment.SCOPE: "a transient systemd scope around the runner's children",
    Containment.PROCESS_GROUP: "process groups, without systemd",
}

AUTO: Final = "auto"
SETTING: Final = (AUTO, *(mode.value for mode in Containment))  # what runner.containment accepts


def systemd_is_running() -> bool:
    """True when systemd is PID 1 (the test sd_booted() makes)."""
    return os.path.isdir("/run/systemd/system")


def resolve(setting: str) -> Containment:
    """``runner.containment`` for a job now: ``auto`` is a service under systemd as root, else process groups."""
    if setting == AUTO:
        return Containment.SERVICE if systemd_is_running() and os.geteuid() == 0 else Containment.PROCESS_GROUP
    return Containment(setting)
