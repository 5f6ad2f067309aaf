"""Signed approvals: which statement a signature is good for, and which refusal it earns.

The `Ledger` remembers the statements approval published (the pending ones
and the newest `RECENT` settled ones, with how they ended) and the digests of
the signatures already used.  `Ledger.check` turns a submitted signature into
a `Signer` or refuses it with the one code that says why:

- ``signature_invalid``: unreadable, or good over none of the statements known;
- ``signature_wrong_namespace``: not made with ``-n airlock-approval``;
- ``signature_wrong_key``: no allowed_signers line lists the key (or not for the principal named);
- ``signer_unknown``: the principal named is not in allowed_signers;
- ``signature_replayed``: this signature was used already (its request was decided);
- ``statement_expired``: good over this request's statement, but that expired;
- ``signature_other_request``: good over another request's statement.

Only ``ssh-keygen`` (`airlock.approval.signers`) says a signature is good.

Publications carry their requester's uid: an agent carrying a signature
(``approve_signed``) is told only about its own requests.  `RefusalLimit`
bounds how many refused signatures one agent uid may send (each costs
``ssh-keygen`` runs and a journal record): past it, ``rate_limited``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from airlock.approval.signers import Signer, Signers
from airlock.approval.statement import NAMESPACE, Signature, Statement, StatementError, read_signature
from airlock.approval.verdict import Publication
from airlock.common.errors import AirlockError, ErrorCode

RECENT = 256  # settled requests whose statements are kept to explain a late or replayed signature
USED = 4096  # signature digests kept to refuse a replay
MAX_PROBES = 16  # other statements tried to explain a signature that is not this request's
REFUSALS = 5  # refused signatures one agent uid may send per REFUSAL_WINDOW seconds
REFUSAL_WINDOW = 60.0


@dataclass(slots=True)
class Published:
    request_id: str
    statements: dict[str, Statement]  # by decision: allow, deny
    uid: int | None = None  # the requester's: request IDs are each agent's own
    state: str = Publication.PENDING  # a `Publication`
    settled_at: float = field(default=0.0)


class Ledger:
    def __init__(self, signers: Signers) -> None:
        self.signers = signers
        self._published: OrderedDict[int, Published] = OrderedDict()  # by id(): a request ID may come back
        self._used: OrderedDict[str, float] = OrderedDict()
        self._dropped_at = 0.0  # when the newest settled publication forgotten (past RECENT) was settled

    def publish(self, request_id: str, statements: dict[str, Statement], uid: int | None = None) -> Published:
        entry = Published(request_id, statements, uid)
        self._published[id(entry)] = entry
        return entry

    def settle(self, published: Published, state: str) -> None:
        published.state = state
        published.settled_at = time.time()
        self._published.move_to_end(id(published))
        settled = [k for k, p in self._published.items() if p.state != Publication.PENDING]
        for key in settled[: max(0, len(settled) - RECENT)]:
            self._dropped_at = max(self._dropped_at, self._published[key].settled_at)
            del self._published[key]

    def settled_since(self, since: float) -> tuple[set[str], bool]:
        """The request IDs settled at ``since`` or later, and whether that list may be short
        (one settled since then was forgotten to keep RECENT): `refs` then refuses prefixes."""
        found = {
            p.request_id for p in self._published.values() if p.state != Publication.PENDING and p.settled_at >= since
        }
        return found, self._dropped_at >= since

    def used(self, signature: Signature) -> None:
        self._used[signature.digest] = time.time()
        while len(self._used) > USED:
            self._used.popitem(last=False)

    def latest(self, request_id: str, owner: int | None = None) -> Published | None:
        """The newest settled publication of ``request_id`` (to explain a signature for a request gone),
        of ``owner``'s requests only when given."""
        for entry in reversed(self._published.values()):
            if entry.request_id == request_id and entry.state != Publication.PENDING and owner in (None, entry.uid):
                return entry
        return None

    @staticmethod
    def read(text: object) -> Signature:
        if not isinstance(text, str) or not text:
            raise AirlockError(
                ErrorCode.INVALID_ARGUMENTS, "signature: must be an armoured SSH signature", {"field": "signature"}
            )
        try:
            signature = read_signature(text)
        except StatementError as exc:
            raise AirlockError(ErrorCode.SIGNATURE_INVALID, f"signature: {exc}", {"field": "signature"}) from None
        if signature.namespace != NAMESPACE:
            raise AirlockError(
                ErrorCode.SIGNATURE_WRONG_NAMESPACE,
                f"the signature is for namespace {signature.namespace!r}; sign with -n {NAMESPACE}",
                {"namespace": signature.namespace, "fingerprint": signature.fingerprint},
            )
        return signature

    async def signer(self, signature: Signature, principal: str | None) -> Signer:
        """Whose key made ``signature`` (allowed_signers), before what it signed is looked at."""
        self.signers.require()
        details = {"fingerprint": signature.fingerprint}
        if signature.digest in self._used:
            raise AirlockError(ErrorCode.SIGNATURE_REPLAYED, "this signature was already used", details)
        found = await self.signers.principals(signature)
        if principal is not None:
            if principal not in found:
                if not self.signers.principal_known(principal):
                    raise AirlockError(
                        ErrorCode.SIGNER_UNKNOWN,
                        f"no principal {principal!r} in allowed_signers",
                        details | {"principal": principal},
                    )
                raise AirlockError(
                    ErrorCode.SIGNATURE_WRONG_KEY,
                    f"the key that signed ({signature.fingerprint}) is not {principal!r}'s",
                    details | {"principal": principal},
                )
        elif not found:
            raise AirlockError(
                ErrorCode.SIGNATURE_WRONG_KEY,
                f"no allowed_signers line lists the key that signed ({signature.fingerprint})",
                details,
            )
        return Signer(principal or found[0], signature.fingerprint, signature.key_type)

    async def check(
        self,
        signature: Signature,
        signer: Signer,
        target: Published | None,
        decisions: Iterable[str],
        now: float,
        *,
        owner: int | None = None,
    ) -> str:
        """The decision ``signature`` signs for ``target`` (a pending request), or the refusal that says why not.

        With ``owner`` (an agent carried it) only that uid's other requests are
        probed to explain a refusal: another agent's request IDs stay unnamed.
        """
        details = {"fingerprint": signer.fingerprint, "principal": signer.principal}
        decisions = tuple(decisions)
        if target is not None:
            for decision in decisions:
                statement = target.statements[decision]
                if await self.signers.verify(signature, signer.principal, statement.to_bytes()):
                    if statement.expires <= now:
                        raise AirlockError(
                            ErrorCode.STATEMENT_EXPIRED, "the statement this signature signs has expired", details
                        )
                    return decision
            others = [d for d in target.statements if d not in decisions]
            for decision in others:
                if await self.signers.verify(signature, signer.principal, target.statements[decision].to_bytes()):
                    raise AirlockError(
                        ErrorCode.SIGNATURE_INVALID,
                        f"this signature signs the {decision} statement, not {' or '.join(decisions)}",
                        details,
                    )
        for probe in list(reversed(self._published.values()))[:MAX_PROBES]:
            if probe is target or owner not in (None, probe.uid):
                continue
            for statement in probe.statements.values():
                if not await self.signers.verify(signature, signer.principal, statement.to_bytes()):
                    continue
                if target is not None and probe.request_id != target.request_id:
                    raise AirlockError(
                        ErrorCode.SIGNATURE_OTHER_REQUEST,
                        f"this signature is for request {probe.request_id!r}, not {target.request_id!r}",
                        details | {"signed_request_id": probe.request_id},
                    )
                if probe.state == Publication.EXPIRED or statement.expires <= now:
                    raise AirlockError(
                        ErrorCode.STATEMENT_EXPIRED,
                        "the statement this signature signs has expired",
                        details | {"signed_request_id": probe.request_id},
                    )
                if probe.state != Publication.PENDING:
                    raise AirlockError(
                        ErrorCode.SIGNATURE_REPLAYED,
                        f"this signature is for request {probe.request_id!r}, which was already {probe.state}",
                        details | {"signed_request_id": probe.request_id},
                    )
                raise AirlockError(
                    ErrorCode.SIGNATURE_OTHER_REQUEST,
                    f"this signature is for request {probe.request_id!r}",
                    details | {"signed_request_id": probe.request_id},
                )
        raise AirlockError(
            ErrorCode.SIGNATURE_INVALID, "the signature does not verify over this request's statement", details
        )


class RefusalLimit:
    """At most `REFUSALS` refused signatures per uid per `REFUSAL_WINDOW` seconds (a sliding window)."""

    def __init__(self, limit: int = REFUSALS, window: float = REFUSAL_WINDOW) -> None:
        self.limit = limit
        self.window = window
        self._times: dict[int, list[float]] = {}

    def _recent(self, uid: int, now: float) -> list[float]:
        times = [t for t in self._times.get(uid, ()) if now - t < self.window]
        if times:
            self._times[uid] = times
        else:
            self._times.pop(uid, None)  # forgotten once quiet: the map stays as small as the active uids
        return times

    def check(self, uid: int, now: float | None = None) -> None:
        """Refuse (``rate_limited``) a uid that used up its refusals, before any work is done for it."""
        now = time.monotonic() if now is None else now
        times = self._recent(uid, now)
        if len(times) >= self.limit:
            retry = max(0.0, self.window - (now - times[0]))
            raise AirlockError(
                ErrorCode.RATE_LIMITED,
                f"too many refused signatures ({len(times)} in {self.window:g}s); try again in {retry:.0f}s",
                {"retry_after_seconds": round(retry, 1)},
            )

    def refused(self, uid: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._times.setdefault(uid, []).append(now)
        self._recent(uid, now)
