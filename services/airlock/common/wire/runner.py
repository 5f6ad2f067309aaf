"""Declarations of the runner's door (runner.sock): intake hands it
approved work, approval its operators' cancels, kills and previews.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use a `wire.verb.Stub` with them.
"""

from __future__ import annotations

from airlock.common.wire.verb import DoorName

DOOR = DoorName.RUNNER
