"""The audit event kinds: who may append each, and its journald MESSAGE_ID.

One table drives three things: the journal's refusal of a kind appended by the
wrong service (intake cannot write ``exec.finished``), the ``MESSAGE_ID`` every
service logs the event under, and ``units/airlock.catalog``, which ships one
entry per ``MESSAGE_ID`` so ``journalctl -x`` explains the event.  Each kind's
place in a request's lifecycle (its transitions, or that it is outside the
lifecycle) comes from ``airlock.common.lifecycle``'s one table
(`KindInfo.transitions`); a kind that table does not classify is refused here.

A ``MESSAGE_ID`` is part of the interface operators script against
(``journalctl MESSAGE_ID=…``): once released it never changes, and a retired
kind keeps its ID reserved.  Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from airlock.common import lifecycle
from airlock.common.errors import AirlockError, ErrorCode

# Marks (the deferred records of one request) a service passes on to the next: intake to
# approval and the runner, each of them to the journal (`common.audit.marks_of`).
MAX_MARKS: Final = 8

# The services that append to the journal.  The writer is taken from the peer's
# SO_PEERCRED by the journal service, never from the message.  "operator" is
# an operator's action written by airlock-approval on the operator's behalf: it
# may append exactly what approval may.
WRITERS: Final = ("intake", "approval", "runner", "journal", "operator")

# The journal's cap on one record's payload (canonical JSON bytes).  Here, not in
# the journal, because the runner must know it too: it checks that a job's end
# record fits before the job may start (issue 29).
MAX_PAYLOAD_BYTES: Final = 64 * 1024

# Writers that stand in for another writer's permissions.
_ACTS_AS: Final[Mapping[str, str]] = MappingProxyType({"operator": "approval"})

_MESSAGE_ID = re.compile(r"[0-9a-f]{32}")
_KIND_NAME = re.compile(r"[a-z]+(?:_[a-z]+)*\.[a-z]+(?:_[a-z]+)*")


@dataclass(frozen=True, slots=True)
class KindInfo:
    name: str
    writers: frozenset[str]
    message_id: str
    summary: str

    def __post_init__(self) -> None:
        if not _KIND_NAME.fullmatch(self.name):
            raise ValueError(f"kind name {self.name!r} is not '<noun>.<past verb>'")
        if not _MESSAGE_ID.fullmatch(self.message_id):
            raise ValueError(f"kind {self.name!r}: MESSAGE_ID must be 32 lowercase hex digits")
        unknown = self.writers - set(WRITERS)
        if not self.writers or unknown:
            raise ValueError(f"kind {self.name!r}: unknown writers {sorted(unknown)}")
        if not lifecycle.classified(self.name):
            raise ValueError(
                f"kind {self.name!r}: common/lifecycle.py neither gives its transitions nor puts it outside"
            )

    @property
    def transitions(self) -> tuple[lifecycle.Transition, ...]:
        """The kind's transitions in a request's lifecycle; empty: outside it (``lifecycle.OUTSIDE``)."""
        return lifecycle.transitions_of(self.name)


_ANY: Final = frozenset({"intake", "approval", "runner", "journal"})


def _table(*infos: KindInfo) -> Mapping[str, KindInfo]:
    by_name = {info.name: info for info in infos}
    ids = [info.message_id for info in infos]
    if len(by_name) != len(infos) or len(set(ids)) != len(ids):
        raise ValueError("kind names and MESSAGE_IDs must be unique")
    return MappingProxyType(by_name)


KINDS: Final[Mapping[str, KindInfo]] = _table(
    # intake: the agents' front door.
    KindInfo(
        "request.received",
        frozenset({"intake"}),
        "1883c9d330514159b1a4910aaf9db7e1",
        "An agent's request was read, validated and accepted for processing.",
    ),
    KindInfo(
        "request.rejected",
        frozenset({"intake"}),
        "8e55b7fc30fe48c08361f064cb6579ad",
        "An agent's request was refused before anything ran.",
    ),
    KindInfo(
        "request.replied",
        frozenset({"intake"}),
        "3103dd987dd94592a13704fa5be7e545",
        "The final response to an agent's request was sent.",
    ),
    KindInfo(
        "operation.replayed",
        frozenset({"intake"}),
        "e63232b5710e44e0b24e80a3cee14732",
        "A retried operation was answered with its stored outcome; nothing ran again.",
    ),
    # approval: policy and operators.
    KindInfo(
        "approval.pending",
        frozenset({"approval"}),
        "6eab29827b0f44899182a35f64032392",
        "A request waits for an operator's decision.",
    ),
    KindInfo(
        "approval.promoted",
        frozenset({"approval"}),
        "3d67a8fc138e41949f223eb6254b0f6e",
        "A request attached to an identical pending one became a question of its own.",
    ),
    KindInfo(
        "approval.decided",
        frozenset({"approval"}),
        "463c78718af842bd97eac7e136969a60",
        "A request was allowed or denied by a rule, an operator or the approval timeout.",
    ),
    KindInfo(
        "operator.action",
        frozenset({"approval", "operator"}),
        "f434a8a62ab5497cad81e7b4fc28b696",
        "An operator used a verb on the operator socket.",
    ),
    KindInfo(
        "policy.reloaded",
        frozenset({"approval"}),
        "c7c2485f233b496b8391cec2c534043c",
        "The approval policy was loaded again from /etc/airlock/policy.d.",
    ),
    KindInfo(
        "policy.rejected",
        frozenset({"approval"}),
        "56b2b3405eeb433e8cbd9f5c5f28f24b",
        "The policy files on disk were refused; the last accepted policy, or none (every request asks), decides.",
    ),
    # runner: the only privileged process.
    KindInfo(
        "exec.started",
        frozenset({"runner"}),
        "d82c1a4b180b46478e2da2a8621231de",
        "An approved command is about to be spawned (durable before the spawn).",
    ),
    KindInfo(
        "exec.finished",
        frozenset({"runner"}),
        "6c4ba951e9604ebb927281dd9e5fbc30",
        "An approved command ended; its exit and output digests are recorded.",
    ),
    KindInfo(
        "exec.cancelled",
        frozenset({"runner"}),
        "1c27c00e6cba4485a28193cf7e4197ad",
        "A running command was stopped before it ended on its own.",
    ),
    KindInfo(
        "exec.refused",
        frozenset({"runner"}),
        "015c15663fe34cdcb3c5784c72208a0b",
        "The runner refused work: a bad ticket, a failed re-check, or a program it could not start.",
    ),
    KindInfo(
        "files.started",
        frozenset({"runner"}),
        "5b0e3f2c8d7a4e61a9c4f1d2b3e4a5c6",
        "An approved file operation is about to run (durable before the file is touched).",
    ),
    KindInfo(
        "files.finished",
        frozenset({"runner"}),
        "a7d94c1e2b3f4a5d8e6c0b9a1f2e3d4c",
        "An approved file operation ended; its outcome and, for writes, the before and after hashes are recorded.",
    ),
    KindInfo(
        "output_log.deleted",
        frozenset({"runner"}),
        "bac41804e2c6419194d950c022babeb3",
        "Output-log retention deleted kept job output (each file, its owner's group, size and why); digests stay.",
    ),
    # Every service, about itself.
    KindInfo(
        "connection.dropped",
        _ANY,
        "0e36b421495d487f94856ad4548ac2b5",
        "A service disconnected a client that did not take its reply in time (limits.write_timeout_seconds).",
    ),
    KindInfo("service.started", _ANY, "b5807ad9adf641479602a79da5d8d4fc", "An airlock service started and is ready."),
    KindInfo("service.stopping", _ANY, "9c661fc9e8264b6cb513c97eccb91b40", "An airlock service is stopping."),
    # The journal, about its own chain (written only by `airlock audit acknowledge`).
    KindInfo(
        "chain.acknowledged",
        frozenset({"journal"}),
        "121ea6510d604b5392be20b7f3dd9086",
        "An operator acknowledged a mismatch between the audit journal and its anchors; a new chain segment began.",
    ),
    # The journal's segments (issue 38, journal/segments.py): written by the journal itself.
    KindInfo(
        "segment.sealed",
        frozenset({"journal"}),
        "f86bfe54c3ca4773a6a1da5f1d1f3134",
        "The live audit segment was sealed: this is its last record; the next segment's first record links to it.",
    ),
    KindInfo(
        "segment.opened",
        frozenset({"journal"}),
        "98f7a771fb934a80ab372c6d1ae1e7b3",
        "A new audit segment began; it names the sealed segment before it (file, range and final hash).",
    ),
    KindInfo(
        "segment.deleted",
        frozenset({"journal"}),
        "b9be8b79bf2845c0b92c60f4f036534c",
        "An archived audit segment was deleted under the retention rules; its range and final hash stay in the chain.",
    ),
    # The journal, after a verify that checked out to the head: where the next (incremental) verify starts.
    KindInfo(
        "chain.verified",
        frozenset({"journal"}),
        "6d1c0b7e94a84f2fb3c5e8a1d0f27c49",
        "airlock audit verify checked the chain up to this head; the next verify starts here (--full: from seq 1).",
    ),
)

if (lifecycle.LIFECYCLE_KINDS | set(lifecycle.OUTSIDE)) - set(KINDS):
    raise ValueError("common/lifecycle.py names kinds the journal does not have")

# journald messages that are not audit records (the chain's anchors and its
# health at start), with MESSAGE_IDs as fixed as the kinds'.
NOTICES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "journal.chain.anchored": "d95f3306ee3b4488bba7c5125f73ec62",
        "journal.chain.mismatched": "bf4b97f7a56d42f9ace8b36d1b309c23",
        "journal.trigger.restored": "be9444cd68d24201acabd5278e3d4f8f",
        # Every committed record, complete, for systemd-journal-upload (journal/fleet.py).
        "journal.record.appended": "7f3c2a9e5b1d4c8e9a6f0d2b4e8c1a57",
        "journal.record.unshipped": "3e8d1f6a2c9b4d07b5a4e6c8f0d2a1b9",
        # An anchor written without its signature (issue 29): no key, or ssh-keygen failed.
        "journal.checkpoint.unsigned": "bfbd27fa49584f37867987667d895f03",
        # airlock-notify (the relay): deliveries to operators' channels.
        "notify.delivery.succeeded": "5b0f6f0e2c8a4d7e9a51c3b7d2e86f14",
        "notify.delivery.failed": "c7e2a94d1f3b4e6a8d05b9f2e1a7c3d8",
        "notify.feed.failed": "2d9e8b7a6c5f4e3d9b1a0c8e7f6d5a49",
        "notify.channel.failing": "8f4c2e1a9b7d4c3e8a6f5b2d1c9e7a40",
        "notify.cursor.reset": "3a7e5c9b1d2f4e8a9c6b0d4f2e8a1c57",
        # The journal's filesystem runs low on space (journal.disk_warn_*), and has room again.
        "journal.disk.low": "a4f0e7c2d95b4b1e8c3a6f9d2e7b0c15",
        "journal.disk.recovered": "58e2b9d04c1f4a7e9b6d3c0a8f1e2d76",
    }
)
if set(NOTICES.values()) & {info.message_id for info in KINDS.values()}:
    raise ValueError("notice and kind MESSAGE_IDs must differ")


def message_id(kind: str) -> str:
    """The stable journald MESSAGE_ID of ``kind``."""
    return kind_info(kind).message_id


def kind_info(kind: str) -> KindInfo:
    info = KINDS.get(kind)
    if info is None:
        raise AirlockError(ErrorCode.INVALID_ARGUMENTS, f"unknown event kind {kind!r}", {"kind": kind})
    return info


def check_writer(writer: str, kind: str) -> KindInfo:
    """Return the kind's entry if ``writer`` may append it; refuse otherwise.

    An unknown kind is the caller's mistake (`invalid_arguments`); a known kind
    from the wrong service is a refusal (`unauthorized`) — a compromised intake
    must not be able to write the runner's evidence.
    """
    info = kind_info(kind)
    if writer not in WRITERS:
        raise AirlockError(ErrorCode.UNAUTHORIZED, f"unknown writer {writer!r}", {"writer": writer})
    if writer not in info.writers and _ACTS_AS.get(writer) not in info.writers:
        raise AirlockError(
            ErrorCode.UNAUTHORIZED,
            f"writer {writer!r} may not append {kind!r}",
            {"writer": writer, "kind": kind},
        )
    return info
