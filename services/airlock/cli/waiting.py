"""What `airlock run` tells its user while a request waits for an operator (both CLI paths).

Imports nothing: `cli/quick.py`, `airlock run`'s short path, uses it too.
"""

from __future__ import annotations

import re

_PLAIN_ID = re.compile(r"[A-Za-z0-9._:-]{1,256}")


def waiting_message(event: dict[str, object]) -> str:
    """The request ID, the rule, the time left, and the command an operator types."""
    request_id = event.get("request_id")
    rule = event.get("rule")
    left = event.get("timeout_seconds")
    rid = request_id if isinstance(request_id, str) and _PLAIN_ID.fullmatch(request_id) else None
    when = f"{left:g}s left" if isinstance(left, int | float) and not isinstance(left, bool) else "until it times out"
    head = f"waiting for an operator to approve request {rid or '(unnamed)'} (rule {rule!r}, {when})"
    return head + (f"; an operator approves it with: airlock approve {rid}" if rid else "")
