"""Who is on the other end of a Unix socket, from the kernel (SO_PEERCRED).

Read once at accept time, before a byte of the request is read.  The group
list comes from SO_PEERGROUPS (the peer process's real supplementary groups
at connect time), falling back to the user database.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from airlock.common.errors import AirlockError, ErrorCode

_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13
_UCRED = struct.Struct("3i")
_MAX_GROUPS = 65536  # NGROUPS_MAX


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int
    user: str
    group_ids: tuple[int, ...]
    groups: frozenset[str]

    def to_dict(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "uid": self.uid,
            "gid": self.gid,
            "user": self.user,
            "groups": sorted(self.groups),
            "group_ids": list(self.group_ids),
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Peer:
        """Rebuild a peer that another airlock service identified (internal use)."""
        pid, uid, gid = data.get("pid"), data.get("uid"), data.get("gid")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (pid, uid, gid)):
            raise ValueError("peer pid, uid and gid must be non-negative integers")
        assert isinstance(uid, int)
        assert isinstance(gid, int)
        assert isinstance(pid, int)
        # The groups intake read from the kernel at accept (SO_PEERGROUPS), so that policy
        # judges the same groups the agent door admitted; without them, the user database.
        ids = data.get("group_ids")
        if ids is None:
            return identify(pid, uid, gid)
        if not (
            isinstance(ids, list)
            and len(ids) <= _MAX_GROUPS
            and all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 2**32 for g in ids)
        ):
            raise ValueError("peer group_ids must be a list of group numbers")
        return identify(pid, uid, gid, ids)


def identity_unavailable() -> AirlockError:
    return AirlockError(
        ErrorCode.IDENTITY_UNAVAILABLE, "the user database could not be read (name service unavailable); retry shortly"
    )


def _lookups_work() -> bool:
    """Whether the user database answers at all: root (uid and gid 0) is in every one.

    Python reports a failed lookup (no file descriptor left, an NSS module down)
    as KeyError, exactly like an unknown uid.  Asking for root tells them apart:
    a database that cannot name root is not answering, and a peer it could not
    name must not be judged as a nameless stranger (issue 28).
    """
    try:
        pwd.getpwuid(0)
        grp.getgrgid(0)
    except KeyError:
        return False
    return True


def user_name(uid: int) -> str:
    """``uid``'s name, its number when it has none; `identity_unavailable` when the database does not answer."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        if not _lookups_work():
            raise identity_unavailable() from None
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        if not _lookups_work():
            raise identity_unavailable() from None
        return str(gid)


def identify(pid: int, uid: int, gid: int, group_ids: Iterable[int] | None = None) -> Peer:
    """The peer with its names; raises `identity_unavailable` (never a nameless peer) when lookups fail."""
    user = user_name(uid)
    if group_ids is None:
        try:
            group_ids = os.getgrouplist(user, gid)
        except (KeyError, OSError):
            if not _lookups_work():
                raise identity_unavailable() from None
            group_ids = [gid]
    ids = tuple(sorted({gid, *group_ids}))
    return Peer(pid=pid, uid=uid, gid=gid, user=user, group_ids=ids, groups=frozenset(group_name(g) for g in ids))


def credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of a connected AF_UNIX stream socket's peer: the kernel's word, no lookup."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid


def peer_of(sock: socket.socket, creds: tuple[int, int, int] | None = None) -> Peer:
    """The credentials of a connected AF_UNIX stream socket's peer, with names (raises `identity_unavailable`)."""
    pid, uid, gid = creds if creds is not None else credentials(sock)
    group_ids: list[int] | None
    try:
        # 1024 bytes (256 groups) is the most Python's getsockopt accepts; a peer
        # with more groups gets ERANGE and falls back to the user database.
        raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 1024)
        group_ids = list(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))
    except OSError:
        group_ids = None
    return identify(pid, uid, gid, group_ids)


@dataclass(frozen=True, slots=True)
class AllowList:
    """Who may use a socket: user names or uids, and group names.

    ``open_to_all`` means anyone who could open the socket file (its mode and
    owner, set by the socket unit, are the first gate).
    """

    users: frozenset[str]
    groups: frozenset[str]
    open_to_all: bool = False
    root: bool = False

    @classmethod
    def of(
        cls, users: Iterable[str], groups: Iterable[str], *, empty_means_all: bool = False, root: bool = False
    ) -> AllowList:
        users, groups = frozenset(users), frozenset(groups)
        return cls(users, groups, open_to_all=empty_means_all and not users and not groups, root=root)

    def allows(self, peer: Peer) -> bool:
        if self.open_to_all or (self.root and peer.uid == 0):
            return True
        if peer.user in self.users or str(peer.uid) in self.users:
            return True
        return bool(self.groups & peer.groups)


def uid_of(user: str) -> int | None:
    """A configured user (name or numeric uid) as a uid, or None if unknown here."""
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


# The operator door's verbs (OPERATOR_VERBS, PASSKEY_VERBS, OBSERVER_VERBS) are declared once,
# in `airlock.common.wire.operator`; the agent door's in `airlock.common.wire.agent`.


def may_decide(
    peer: Peer, operator_users: Iterable[str], operator_groups: Iterable[str], observer_users: Iterable[str]
) -> bool:
    """Whether a peer on operator.sock is a full operator, not a read-only observer.

    root always is.  A user named in ``operators.users`` is; a user named in
    ``operators.observers.users`` is not, whatever its groups (so the relay
    can hold the socket's group to open the file and still only read); else
    membership of an operator group decides.  Observer groups never grant
    more than reading.
    """
    users, observers = set(operator_users), set(observer_users)
    if peer.uid == 0 or peer.user in users or str(peer.uid) in users:
        return True
    if peer.user in observers or str(peer.uid) in observers:
        return False
    return bool(set(operator_groups) & peer.groups)
