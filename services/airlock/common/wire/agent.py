"""Declarations of the agent door (agent.sock, served by intake): the native verbs an agent may call.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use a `wire.verb.Stub` with them.
"""

from __future__ import annotations

from airlock.common.wire.verb import DoorName

DOOR = DoorName.AGENT
