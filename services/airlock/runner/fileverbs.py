"""The runner's file verbs: ``files`` (approved work) and ``files_preview`` (the operator's diff).

``files`` follows the same two rules as ``exec``: the ticket is redeemed
(single use, bound to the file spec's digest) before anything is touched, and
``files.started`` is durable in the journal first.  ``files.finished`` records
the outcome without content: the error code, and for writes the before and
after hashes.

``files_preview`` is asked by approval for a write or edit that waits for an
operator: it computes, as the target identity, the unified diff the operation
would make now, and writes nothing.  Its answer goes to operators only.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from airlock.common import validate
from airlock.common.audit import Ids
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.filespec import FileSpec
from airlock.common.server import Call
from airlock.runner import files
from airlock.runner.identity import Identity, resolve_identity

# Fields of an outcome kept in the audit record (never content).
_AUDITED = ("ok", "error", "before_sha256", "after_sha256", "size_bytes", "created", "content_sha256", "length_bytes",
            "offset_bytes", "uid", "gid", "duration_ms")


class FileVerbs:
    def __init__(self, runner: Any) -> None:
        self.runner = runner  # runner.service.Runner: config, audit, approval client, _refuse

    def _identity(self, spec: FileSpec) -> Identity:
        euid = os.geteuid()
        if spec.run_as != euid and euid != 0:
            what = "privileged requests need" if spec.privileged else "working as another user needs"
            raise AirlockError(
                ErrorCode.PRIVILEGE_UNAVAILABLE, f"{what} airlock-runner to run as root; this runner runs as uid {euid}"
            )
        return resolve_identity(spec.run_as)

    def _timeout(self) -> float:
        return float(self.runner.config.limits.default_timeout_seconds)

    async def files(self, call: Call) -> dict[str, Any]:
        # Approval's uid reaches this socket too (files_preview, cancel); only intake may start work.
        if self.runner.intake_uid is None or call.peer.uid != self.runner.intake_uid:
            self.runner.log.warning("runner.peer.refused", verb="files", peer_uid=call.peer.uid, peer_pid=call.peer.pid)
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        a = call.args
        spec = FileSpec.from_dict(a.get("spec"))
        ticket = validate.text("ticket", a.get("ticket"), max_len=256, allow_empty=False)
        request_id = validate.optional_text("request_id", a.get("request_id"), max_len=256)
        operation_id = validate.text("operation_id", a.get("operation_id"), max_len=256, allow_empty=False)
        session = validate.optional_text("session", a.get("session"), max_len=256)
        ids = Ids(request_id, operation_id, spec.uid, session)
        digest = spec.digest()
        try:
            bound = validate.mapping("bound", a.get("bound"))
            await self.runner.approval.call("redeem", {"ticket": ticket, "digest": digest, "bound": bound})
        except AirlockError as exc:
            raise await self.runner._refuse(exc, ids) from None
        try:
            identity = self._identity(spec)
        except AirlockError as exc:
            raise await self.runner._refuse(exc, ids) from None
        await self.runner.audit.record(
            "files.started", ids, payload={"digest": digest, "file": spec.describe(), "uid": identity.uid, "gid": identity.gid}
        )
        outcome = await files.execute(spec, identity, timeout=self._timeout())
        outcome = outcome | {"operation_id": operation_id, "tool": spec.tool, "path": spec.path,
                             "hostname": socket.gethostname()}
        error = outcome.get("error") or {}
        await self.runner.audit.record(
            "files.finished",
            ids,
            payload={"tool": spec.tool, "path": spec.path} | {k: outcome[k] for k in _AUDITED if k in outcome},
            log_fields={"ok": outcome.get("ok"), "code": error.get("code")},
        )
        return outcome

    async def files_preview(self, call: Call) -> dict[str, Any]:
        spec = FileSpec.from_dict(call.args.get("spec"))
        if not spec.writes:
            raise validate.bad("spec", "only writes and edits have a preview")
        identity = self._identity(spec)
        return await files.execute(spec, identity, timeout=min(self._timeout(), 30.0), preview_only=True)
