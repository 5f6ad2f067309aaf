"""The enrolled passkeys, and how an assertion is checked against them (issue 33).

`Credentials` reads the root-owned credential file at every use (a
revocation applies at once), says who an account is here (operator,
observer, neither), verifies an assertion (`webauthn`: origin, RP ID,
challenge, user presence and verification, signature, sign counter) and
spends it: the counter kept in ``approval.state_dir`` (`CounterStore`, so
it survives restarts) and the assertion remembered so it is never used
twice.  `passkeys.Passkeys` holds one.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airlock.approval import webauthn
from airlock.approval.webauthn import Refused
from airlock.common import passkeyfile
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.passkeyfile import Credential, PasskeyFileError
from airlock.common.peer import identify, may_decide, uid_of

USED = 4096  # assertion digests kept to refuse a replay


class CounterStore:
    """Each credential's last sign counter, in a JSON file of approval's own (atomically replaced)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "passkey-counters.json"
        self._counts: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._counts is None:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                data = {}
            except (OSError, ValueError) as exc:
                # Fail closed: without the counters a cloned authenticator could not be told apart.
                raise AirlockError(ErrorCode.INTERNAL, f"{self.path}: cannot read the sign counters ({exc})") from None
            self._counts = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)}
        return self._counts

    def get(self, credential_id: str) -> int:
        return self._load().get(credential_id, 0)

    def set(self, credential_id: str, count: int) -> None:
        counts = dict(self._load())
        counts[credential_id] = count
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(counts, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            raise AirlockError(
                ErrorCode.INTERNAL, f"{self.path}: cannot keep the sign counter ({exc.strerror})"
            ) from None
        self._counts = counts


def refused(exc: Refused) -> AirlockError:
    code = ErrorCode.INVALID_ARGUMENTS if exc.reason == "malformed" else ErrorCode.UNAUTHORIZED
    return AirlockError(code, exc.message, {"reason": exc.reason})


def no(reason: str, message: str, **details: Any) -> AirlockError:
    return AirlockError(ErrorCode.UNAUTHORIZED, message, {"reason": reason, **details})


class Credentials:
    """The enrolled passkeys (read at each use), their sign counters, the assertions used."""

    def __init__(self, settings: Callable[[], Config], log: Any) -> None:
        self._settings = settings
        self.log = log
        self.counters = CounterStore(settings().approval.state_dir)
        self.used_assertions: OrderedDict[str, float] = OrderedDict()

    @property
    def config(self) -> Config:
        return self._settings()

    def web(self) -> tuple[str, str]:
        """(origin, RP ID), or `conflict` when web.url is not set (passkeys off)."""
        web = self.config.web
        if not web.url:
            raise AirlockError(ErrorCode.CONFLICT, "passkeys are off: set web.url (docs/operations.md, Passkeys)")
        return web.origin, web.relying_party

    def role(self, account: str) -> str | None:
        """``operator``, ``observer`` or None (neither, or the web process's own user)."""
        if account == self.config.web.user:
            return None
        uid = uid_of(account)
        if uid is None:
            return None
        try:
            import pwd

            peer = identify(0, uid, pwd.getpwuid(uid).pw_gid)
        except (KeyError, AirlockError):
            return None
        o = self.config.operators
        if may_decide(peer, o.users, o.groups, o.observers.users):
            return "operator"
        if account in o.observers.users or str(uid) in o.observers.users or set(o.observers.groups) & peer.groups:
            return "observer"
        return None

    def all(self) -> list[Credential]:
        try:
            found, bad = passkeyfile.read(self.config.approval.passkeys)
        except (PasskeyFileError, OSError) as exc:
            raise AirlockError(ErrorCode.INTERNAL, f"the passkeys file cannot be read: {exc}") from None
        if bad:
            self.log.warning("approval.passkeys.unreadable_lines", path=str(self.config.approval.passkeys), lines=bad)
        return found

    def credential(self, credential_id: bytes) -> Credential:
        cid = webauthn.b64u(credential_id)
        for credential in self.all():
            if credential.credential_id == cid:
                if credential.revoked is not None:
                    raise no("revoked", f"passkey {cid} was revoked", credential_id=cid)
                return credential
        raise no("unknown_credential", "this passkey is not enrolled here", credential_id=cid)

    def verified(self, credential: object, challenge: bytes) -> tuple[Credential, int, str]:
        """The enrolled credential that made this assertion over ``challenge``, its new counter, its digest."""
        origin, rp_id = self.web()
        try:
            assertion = webauthn.parse_assertion(credential, origin)
        except Refused as exc:
            raise refused(exc) from None
        enrolled = self.credential(assertion.credential_id)
        try:
            count = webauthn.verify_assertion(
                assertion, rp_id, challenge, webauthn.unb64u(enrolled.public_key, "public_key", 4096)
            )
        except Refused as exc:
            refused_ = refused(exc)
            refused_.details["credential_id"] = enrolled.credential_id
            raise refused_ from None
        if assertion.digest in self.used_assertions:
            raise no("replayed", "this assertion was used already", credential_id=enrolled.credential_id)
        last = self.counters.get(enrolled.credential_id)
        if (count or last) and count <= last:
            # A counter that does not grow: a cloned authenticator, or a replay.
            raise no(
                "counter",
                f"the sign counter did not increase ({count} after {last}): a cloned authenticator?",
                credential_id=enrolled.credential_id,
            )
        return enrolled, count, assertion.digest

    def spend(self, credential_id: str, count: int, digest: str) -> None:
        """Keep the counter (before the assertion takes effect) and remember the assertion."""
        if count:
            self.counters.set(credential_id, count)
        self.used_assertions[digest] = time.time()
        while len(self.used_assertions) > USED:
            self.used_assertions.popitem(last=False)

    def deciders(self) -> list[str]:
        return [c.credential_id for c in self.all() if c.revoked is None and self.role(c.account) == "operator"]
