"""What approval's verbs are built from: one holder of what a reload replaces, the services it talks
to, and its books (issue 47: parts take the pending table and these, not a dozen collaborators).

`Live` is approval itself (service.Approval): ``config``, ``policy`` and ``notifier`` are read when
used, so a reload reaches every part and a pending request keeps what it was given.  `Outside` is
who approval talks to; `Books` the state with one owner each (the hold and tickets, grants, published
statements, ask limits, session tokens).  The pending requests are `table.PendingTable`, which alone
settles them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from airlock.approval import hook
    from airlock.approval.asks import AskLimits
    from airlock.approval.granting import GrantBook
    from airlock.approval.rules import Policy
    from airlock.approval.sessions import SessionTokens
    from airlock.approval.signed import Ledger
    from airlock.approval.tickets import TicketBook
    from airlock.common.audit import Audit
    from airlock.common.config import Config
    from airlock.common.ipc import Client
    from airlock.common.wire.verb import Stub


class Live(Protocol):
    """What a reload replaces, read when used."""

    @property
    def config(self) -> Config: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def notifier(self) -> hook.NotifyCommand: ...


@dataclass(frozen=True, slots=True)
class Outside:
    """Who approval talks to: the journal (records and reads), the runner, the log, and its host name."""

    audit: Audit
    journal: Stub
    runner: Client
    log: Any
    host: str


@dataclass(frozen=True, slots=True)
class Books:
    """approval's state, each with one owner: the hold and tickets, grants, published statements,
    the per-agent ask limits and the session tokens."""

    tickets: TicketBook
    grants: GrantBook
    ledger: Ledger
    asks: AskLimits
    sessions: SessionTokens
