"""An agent's file request (``files_read`` … ``files_edit``), validated field by field.

Pure: no I/O, like `intake.request`: native ``args`` go in, a `FileRequest` or an
`AirlockError` naming the field comes out.  The envelope fields are the ones
an exec request has (``privileged``, ``operation_id``, ``reason``,
``session``, ``host``, ``time`` for freshness); the rest are the tool's own
parameters (see `common.fileop_spec`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from airlock.common import validate
from airlock.common.config import Config
from airlock.common.fileop_spec import FILE_TOOLS, FileSpec
from airlock.common.peer import Peer
from airlock.intake.request import parse_time

ENVELOPE_FIELDS = frozenset({"path", "privileged", "operation_id", "reason", "session", "host", "time"})
VERBS = tuple(sorted(FILE_TOOLS))


@dataclass(frozen=True, slots=True)
class FileRequest:
    request_id: str
    spec: FileSpec
    operation_id: str | None = None
    reason: str = ""
    session: str = ""
    host: str = ""
    time: str = ""

    def describe(self) -> dict[str, Any]:
        """What an operator and the audit record see (write content only as a digest)."""
        return {
            "request_id": self.request_id,
            "reason": self.reason,
            "session": self.session,
            "host": self.host,
            "time": self.time,
            **self.spec.describe(),
        }


def native_files(
    verb: str, request_id: str | None, args: dict[str, Any], peer: Peer, config: Config, now: float
) -> FileRequest:
    rid = validate.request_id("id", request_id) if request_id is not None else str(uuid.uuid4())
    params = {k: v for k, v in args.items() if k not in ENVELOPE_FIELDS}
    spec = FileSpec(
        tool=verb,
        path=args.get("path"),  # type: ignore[arg-type]  # checked by FileSpec
        privileged=validate.boolean("privileged", args.get("privileged"), True),
        uid=peer.uid,
        params=params,
    )
    operation_id = validate.optional_text("operation_id", args.get("operation_id"), max_len=128)
    if operation_id is not None and not operation_id:
        raise validate.bad("operation_id", "must not be empty")
    return FileRequest(
        request_id=rid,
        spec=spec,
        operation_id=operation_id,
        reason=validate.text("reason", args.get("reason") or "", max_len=4096),
        session=validate.text("session", args.get("session") or "", max_len=256),
        host=validate.text("host", args.get("host") or "", max_len=256),
        time=parse_time(args.get("time"), config, now),
    )
