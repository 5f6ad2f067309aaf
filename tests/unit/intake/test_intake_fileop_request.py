"""intake/fileop_request.py: an agent's file request, validated field by field before anything else sees it."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import pytest

from airlock.common import config
from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.fileop_spec import FILE_TOOLS
from airlock.common.peer import Peer
from airlock.intake import fileop_request

PEER = Peer(pid=1, uid=1000, gid=1000, user="agent", group_ids=(1000,), groups=frozenset({"agent"}))
NOW = time.time()


def request(verb: str = "files_read", rid: str | None = "r-1", **args: Any) -> fileop_request.FileRequest:
    return fileop_request.native_files(
        verb, rid, {"path": "/etc/hostname", "time": iso_utc(NOW)} | args, PEER, config.defaults(), NOW
    )


def refused(verb: str = "files_read", rid: str | None = "r-1", **args: Any) -> AirlockError:
    with pytest.raises(AirlockError) as caught:
        request(verb, rid, **args)
    return caught.value


def test_the_agent_door_offers_every_file_tool_and_nothing_else() -> None:
    assert set(fileop_request.VERBS) == FILE_TOOLS
    assert list(fileop_request.VERBS) == sorted(fileop_request.VERBS)


def test_a_request_keeps_the_envelope_apart_from_the_tool_parameters() -> None:
    req = request(operation_id="op-7", reason="check it", session="s", host="web1", length_bytes=10, privileged=False)
    assert (req.request_id, req.operation_id, req.reason, req.session, req.host) == (
        "r-1",
        "op-7",
        "check it",
        "s",
        "web1",
    )
    spec = req.spec
    assert (spec.tool, spec.path, spec.privileged, spec.uid) == ("files_read", "/etc/hostname", False, 1000)
    assert spec.params == {"offset_bytes": 0, "length_bytes": 10}  # defaults filled in, envelope fields out


def test_privileged_is_the_default_and_the_uid_is_the_peers() -> None:
    req = request()
    assert req.spec.privileged is True and req.spec.uid == PEER.uid
    # A request cannot name a uid of its own: it is not a parameter of any tool.
    assert refused(uid=0).message == "uid: is not a parameter of files_read"


def test_without_an_id_one_is_made() -> None:
    assert len(request(rid=None).request_id) == 36


@pytest.mark.parametrize(
    ("args", "field", "code"),
    [
        ({"operation_id": ""}, "operation_id", ErrorCode.INVALID_ARGUMENTS),
        ({"reason": 5}, "reason", ErrorCode.INVALID_ARGUMENTS),
        ({"privileged": "yes"}, "privileged", ErrorCode.INVALID_ARGUMENTS),
        ({"time": None}, "time", ErrorCode.STALE_REQUEST),
        ({"time": "2000-01-01T00:00:00Z"}, "time", ErrorCode.STALE_REQUEST),
        ({"path": "relative/path"}, "path", ErrorCode.INVALID_ARGUMENTS),
        ({"length_bytes": -1}, "length_bytes", ErrorCode.INVALID_ARGUMENTS),
        ({"surprise": 1}, "surprise", ErrorCode.INVALID_ARGUMENTS),
    ],
)
def test_each_bad_field_is_named(args: dict[str, Any], field: str, code: ErrorCode) -> None:
    error = refused(**args)
    assert error.code is code
    assert (error.details or {}).get("field") == field or field in error.message, (error.message, error.details)


def test_an_overlong_id_is_refused() -> None:
    assert refused(rid="x" * 257).code is ErrorCode.INVALID_ARGUMENTS


def test_what_an_operator_sees_of_a_write_is_the_contents_digest_not_the_bytes() -> None:
    content = b"secret-ish contents\n"
    req = request("files_write", content=base64.b64encode(content).decode(), path="/tmp/x", reason="write it")
    seen = req.describe()
    assert seen["request_id"] == "r-1" and seen["reason"] == "write it" and seen["tool"] == "files_write"
    assert seen["params"]["content_sha256"] == hashlib.sha256(content).hexdigest()
    assert seen["params"]["content_bytes"] == len(content)
    assert "content" not in seen["params"]


def test_the_same_request_has_the_same_digest_whether_defaults_are_written_or_not() -> None:
    assert request().spec.digest() == request(offset_bytes=0).spec.digest()
    assert request().spec.digest() != request(offset_bytes=1).spec.digest()
