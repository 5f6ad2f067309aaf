"""The runner's one write for approval (issue 33): add or revoke a line of the passkeys file.

approval runs unprivileged under ProtectSystem=strict and cannot write
``approval.passkeys`` (root's, beside allowed_signers).  After approval has
checked a registration bound to a one-time enrollment token (or a revocation
by root or the credential's own account), it asks here: ``passkeys.write``
with ``op`` ``add`` (a whole credential, every field validated, the COSE key
parsed) or ``revoke`` (a credential ID: its line gets ``revoked``).  Only
approval's uid is served; the path is the runner's own configuration, never
the request's.  The file is rewritten atomically (`common.passkeyfile.rewrite`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from airlock.common import passkeyfile, validate
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.passkeyfile import Credential, PasskeyFileError
from airlock.common.server import Call
from airlock.common.wire import runner as wire

MAX_CREDENTIALS = 4096  # lines the file may hold: an upper bound a person never meets


class PasskeyWriter:
    def __init__(self, config: Config) -> None:
        self.path = config.approval.passkeys
        self._lock = asyncio.Lock()  # one rewrite at a time

    async def write(self, call: Call, args: wire.PasskeyWrite) -> wire.Written:
        # Only approval calls this (the door's declaration); the path is the runner's own setting.
        if args.op == "add":
            try:
                credential = passkeyfile.checked(args.credential)
            except PasskeyFileError as exc:
                raise validate.bad("credential", str(exc)) from None
            if credential.revoked is not None:
                raise validate.bad("credential", "a new passkey is not revoked")
            change = _add(credential)
        else:  # revoke: the message's check() named the credential
            change = _revoke(str(args.credential_id), int(time.time()))
        async with self._lock:
            try:
                await asyncio.to_thread(passkeyfile.rewrite, self.path, change)
            except PasskeyFileError as exc:
                raise AirlockError(ErrorCode.CONFLICT, str(exc)) from None
            except OSError as exc:
                raise AirlockError(ErrorCode.INTERNAL, f"{self.path}: {exc.strerror}") from None
        return wire.Written(True)


def _add(credential: Credential) -> Any:
    def change(lines: list[str], found: list[Credential]) -> list[str]:
        if any(c.credential_id == credential.credential_id for c in found):
            raise PasskeyFileError("this credential is enrolled already")
        if len(found) >= MAX_CREDENTIALS:
            raise PasskeyFileError(f"the file holds {MAX_CREDENTIALS} passkeys already")
        return [*lines, credential.to_line()]

    return change


def _revoke(credential_id: str, now: int) -> Any:
    def change(lines: list[str], found: list[Credential]) -> list[str]:
        import json

        out, hit = [], False
        for line in lines:
            try:
                current = passkeyfile.checked(json.loads(line))
            except (ValueError, PasskeyFileError):
                out.append(line)  # not ours to judge: kept as it is
                continue
            if current.credential_id == credential_id and current.revoked is None:
                current = Credential(current.credential_id, current.public_key, current.account, current.created, now)
                hit = True
            out.append(current.to_line())
        if not hit:
            raise PasskeyFileError(f"no passkey {credential_id!r} in use")
        return out

    return change
