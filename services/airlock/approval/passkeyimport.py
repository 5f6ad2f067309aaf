"""``passkey.import`` (issue 49): root lists passkeys enrolled elsewhere (the fleet console's origin) here.

A fleet's operators enroll once, with the console's origin; each host lists
their credentials in its own ``approval.passkeys`` from `airlock passkey
export` lines, distributed as ``allowed_signers`` is (config management).
Only root may import: a line names the account whose votes it makes, so an
operator who could import could vote as another.  Each credential is
checked line by line (`passkeyfile.checked`), its account must be an
operator or an observer here, and it is journaled before the runner writes
it (as an enrollment is).  A line marked revoked revokes that credential
here (its console sessions end): a revocation reaches every host through
the same file.  A credential already listed is left as it is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from airlock.approval.assertions import no
from airlock.common import validate
from airlock.common.audit import Ids
from airlock.common.passkeyfile import Credential, PasskeyFileError, checked
from airlock.common.server import Call
from airlock.common.wire import passkey as pk
from airlock.common.wire import runner as runner_wire

if TYPE_CHECKING:
    from airlock.approval.passkeys import Passkeys


class PasskeyImport:
    """The ``passkey.import`` verb, over what `Passkeys` holds (the journal, the runner, the credentials)."""

    def __init__(self, passkeys: Passkeys) -> None:
        self.passkeys = passkeys

    async def passkey_import(self, call: Call, args: pk.PasskeyImport) -> pk.PasskeysImported:
        if call.peer.uid != 0:
            raise no("not_root", "only root may import passkeys (a line decides whose votes a passkey makes)")
        source = args.source or ""
        wanted: list[Credential] = []
        for n, line in enumerate(args.credentials, 1):
            try:
                credential = checked(line)
            except PasskeyFileError as exc:
                raise validate.bad("credentials", f"line {n}: {exc}") from None
            if credential.revoked is None and self.passkeys.keys.role(credential.account) is None:
                why = f"line {n}: {credential.account!r} is neither an operator nor an observer here"
                raise validate.bad("credentials", why)
            wanted.append(credential)
        here = {c.credential_id: c for c in self.passkeys.keys.all()}
        results = [await self._one(call, c, here.get(c.credential_id), source) for c in wanted]
        return pk.PasskeysImported(tuple(pk.Imported(c.credential_id, c.account, r) for c, r in results))

    async def _one(
        self, call: Call, credential: Credential, here: Credential | None, source: str
    ) -> tuple[Credential, str]:
        """The credential and what became of it here."""
        if credential.revoked is not None:
            if here is None or here.revoked is not None:
                return credential, "revoked already" if here else "not listed here"
            return credential, await self._revoke(call, credential, source)
        if here is not None:
            return credential, "listed already" if here.revoked is None else "revoked here (kept revoked)"
        said = {"credential_id": credential.credential_id, "account": credential.account}
        payload = {"action": "passkey.imported", "operator": call.peer.user, "source": source, **said}
        await self.passkeys.audit.record("operator.action", Ids(peer_uid=call.peer.uid), payload=payload)  # first
        line = Credential(credential.credential_id, credential.public_key, credential.account, credential.created)
        await runner_wire.stub(self.passkeys.runner).call(
            runner_wire.PASSKEYS_WRITE, runner_wire.PasskeyWrite("add", credential=json.loads(line.to_line()))
        )
        self.passkeys.log.info("approval.passkey.imported", **said, source=source)
        return credential, "imported"

    async def _revoke(self, call: Call, credential: Credential, source: str) -> str:
        cid = credential.credential_id
        payload = {
            "action": "passkey.revoke",
            "operator": call.peer.user,
            "account": credential.account,
            "credential_id": cid,
            "reason": f"revoked in an import ({source})" if source else "revoked in an import",
        }
        await self.passkeys.audit.record("operator.action", Ids(peer_uid=call.peer.uid), payload=payload)
        await runner_wire.stub(self.passkeys.runner).call(
            runner_wire.PASSKEYS_WRITE, runner_wire.PasskeyWrite("revoke", credential_id=cid)
        )
        ended = self.passkeys.consoles.sessions.end(lambda s: s.credential_id == cid)
        return f"revoked ({len(ended)} console session(s) ended)"
