"""Reading the events feed on operator.sock: one bounded call, and a uid as the name operators know."""

from __future__ import annotations

import pwd
from typing import Any, TypeVar

from airlock.common import client
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb

A = TypeVar("A", bound=Message)

FEED_TIMEOUT_SECONDS = 30.0
PAGE = 256  # events asked for in one call


class FeedError(Exception):
    """operator.sock could not be read (not there, refused, or answered an error)."""


def feed_call(socket_path: str, verb: Verb[A, Any], args: A) -> dict[str, Any]:
    try:
        _raw, reply = client.call(socket_path, verb, args, timeout=FEED_TIMEOUT_SECONDS)
    except (client.ClientError, OSError) as exc:
        raise FeedError(str(exc)) from None
    if not reply.get("ok"):
        error = reply.get("error") or {}
        raise FeedError(f"{error.get('code')}: {error.get('message')}")
    data: dict[str, Any] = reply.get("data") or {}
    return data


def user_of(uid: object) -> str:
    if not isinstance(uid, int):
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
