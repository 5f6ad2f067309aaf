"""`airlock running`: the jobs running now, with the names of their uids as this host knows them.

What `airlock kill` takes, and what a fleet console reads over SSH for each host's card (docs/fleet.md):
the console runs on another machine and cannot name a host's uids itself.
"""

from __future__ import annotations

import argparse
import json

from airlock.cli.base import _operator_call, _table
from airlock.common.render import command_line, sanitise
from airlock.common.wire import operator as op
from airlock.common.wire.verb import Empty


def cmd_running(ns: argparse.Namespace) -> int:
    """The jobs running now (the runner's list): what `airlock kill` takes, and what a fleet console shows.

    Each job also gets the names of its uids as this host knows them (``user``: as whom it runs, ``agent``:
    who asked), read here: a fleet console on another machine cannot look them up."""
    answered = _operator_call(ns, op.RUNNING, Empty())
    if answered is None:
        return 1
    reply = answered[1]
    jobs = [
        job | {"user": _name_of(job.get("uid")), "agent": _name_of(job.get("agent_uid"))}
        for job in (reply.get("data") or {}).get("running") or []
        if isinstance(job, dict)
    ]
    if ns.json:
        print(json.dumps(reply | {"data": {"running": jobs}}, separators=(",", ":")))
        return 0
    rows = [
        [
            sanitise(job.get("request_id") or job.get("operation_id")),
            sanitise(job["user"] or job.get("uid")),
            sanitise(job["agent"] or job.get("agent_uid")),
            sanitise(job.get("started_at")),
            sanitise(" | ".join(command_line(stage) for stage in job.get("stages") or [])),
        ]
        for job in jobs
    ]
    print(_table(rows, ["job", "as", "agent", "since", "command"]) if rows else "nothing running")
    return 0


def _name_of(uid: object) -> str | None:
    import pwd

    if not isinstance(uid, int):
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
