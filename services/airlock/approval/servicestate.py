"""What `airlock status` says of the services: up, listening or missing, and the journal's size."""

from __future__ import annotations

import os
import stat
from typing import Any

from airlock.common.config import Config
from airlock.common.errors import AirlockError
from airlock.common.wire import journal as jwire
from airlock.common.wire.verb import Empty, Stub


async def services_state(config: Config, journal: Stub) -> dict[str, Any]:
    """Whether the other services can be reached.

    The journal is asked (it is needed anyway, and reports its size).
    Intake's and the runner's sockets are only looked at: connecting would
    start a socket-activated root runner just to answer a status query.
    """
    out: dict[str, Any] = {"approval": {"state": "up", "pid": os.getpid()}}
    try:
        head = await journal.call(jwire.HEAD, Empty(), timeout=5)
        out["journal"] = {"state": "up", "events": head.seq}
    except AirlockError as exc:
        out["journal"] = {"state": "down", "error": exc.message}
    try:
        out["journal"]["disk"] = (await journal.call(jwire.DISK, Empty(), timeout=5)).to_dict()
    except AirlockError as exc:
        out["journal"]["disk"] = {"error": exc.message}
    for name, door in (("intake", "agent"), ("runner", "runner")):
        try:
            listening = stat.S_ISSOCK(os.stat(config.socket_path(door)).st_mode)
        except OSError:
            listening = False
        out[name] = {"state": "listening" if listening else "missing"}
    return out
