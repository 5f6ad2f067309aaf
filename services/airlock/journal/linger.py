"""The journal's stop waits for the airlock services that are stopping (issue 50).

intake, approval and the runner write their last records on the way out
(``service.stopping``, their requests' endings): the journal must still serve
them.  That used to be ``After=airlock-journal.service`` on each, but systemd
orders starts by the same line, so after an idle exit approval and the runner
started only once the journal was ready (~140 ms of a cold start).  The units
now start side by side, and the journal's ``ExecStop=`` runs this command
(as root, ``+``): before systemd sends the journal its SIGTERM, it waits while
any of the three is stopping -- its state ``deactivating`` or a stop job
queued for it -- at most ``BOUND_SECONDS`` (28 s).  A ``systemctl stop`` of all four
and a poweroff both put the four stops in one transaction, so the others are
already stopping when this asks; the journal stopped alone (a restart) waits
for nothing.

``stopping`` reads ``systemctl``'s output and nothing else (tested without systemd);
`linger` asks and polls.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence

from airlock.common import child

# The services that journal on their way out (units/airlock-{intake,approval,runner}.service).
PEERS = ("airlock-intake.service", "airlock-approval.service", "airlock-runner.service")
# Under the journal unit's TimeoutStopSec= (30 s), which bounds each ExecStop= command.  A stopping
# service gives its in-flight work services.stop_timeout_seconds (20 s by default) and its records
# 5 s more, and is killed at its own TimeoutStopSec= (30 s): 28 s covers the default with room.
BOUND_SECONDS = 28.0
POLL_SECONDS = 0.05
# A job that ends in a stop: `systemctl stop`, a restart's first half, a shutdown's.
STOP_JOBS = frozenset({"stop", "restart", "try-restart", "reload-or-restart"})


def stopping(states: str, jobs: str, peers: Sequence[str] = PEERS) -> list[str]:
    """The peers still stopping, from ``systemctl is-active PEERS`` and ``systemctl list-jobs --plain --no-legend``.

    ``states`` has one line per peer, in order; ``jobs`` one ``ID UNIT TYPE STATE`` line per job.
    """
    found = {peer for peer, state in zip(peers, states.split(), strict=False) if state == "deactivating"}
    for line in jobs.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] in peers and fields[2] in STOP_JOBS:
            found.add(fields[1])
    return [peer for peer in peers if peer in found]


async def _systemctl(*args: str) -> str:
    # is-active exits non-zero when a unit is not active: its output is what counts.
    done = await child.run(["systemctl", *args], env=child.environment(), timeout=5)
    return done.stdout.decode(errors="replace")


async def linger() -> None:
    """Wait while a peer is stopping, up to BOUND_SECONDS; say on stderr (the journal unit's log) what it waited for."""
    started = time.monotonic()
    waited: list[str] = []
    left: list[str] = []
    while time.monotonic() - started < BOUND_SECONDS:
        try:
            states = await _systemctl("is-active", *PEERS)
            left = stopping(states, await _systemctl("list-jobs", "--plain", "--no-legend"))
        except OSError as exc:
            print(f"airlock-journal: stop: cannot ask systemd ({exc}); not waiting", file=sys.stderr)
            return
        if not left:
            if waited:
                took = (time.monotonic() - started) * 1000
                print(f"airlock-journal: stop waited {took:.0f} ms for {', '.join(waited)}", file=sys.stderr)
            return
        waited = sorted(set(waited) | set(left))
        await asyncio.sleep(POLL_SECONDS)
    print(f"airlock-journal: stop stopped waiting after {BOUND_SECONDS:.0f} s for {', '.join(left)}", file=sys.stderr)


def main() -> int:
    asyncio.run(linger())
    return 0


if __name__ == "__main__":
    sys.exit(main())
