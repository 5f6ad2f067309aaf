"""A rule's credentials (issue 35): checked and read by the runner, handed to the job by systemd.

A rule may name credentials (``credentials: {db: /etc/airlock/credentials/db.pass}``);
approval binds each stage's to the ticket (``bound["credentials"]``).  Before
the job starts the runner opens every file from ``/`` one component at a time
with ``O_NOFOLLOW`` and refuses (``credential_unsafe``) unless the file and
every directory above it are root's alone (common/binary.py's test), then
reads the value through that fd.  The value never leaves the runner: it writes
what it read to a root-only copy in its runtime directory (removed when the
job ends) and the job's transient unit gets ``LoadCredential=NAME:COPY``
(systemd copies the file into the unit's private ``$CREDENTIALS_DIRECTORY``,
readable by the job's user only), the value joins the protected values redacted from every output stream
(streams.py: before the agent, the output log or a log sees it), and
``exec.started`` records only each name and its SHA-256.

Why ``LoadCredential=`` and not ``SetCredential=``: a transient unit's
properties are written to ``/run/systemd/transient/`` and shown by
``systemctl show`` to every local user; ``LoadCredential=`` passes a path.
Why a copy and not the rule's file: systemd opens the path again when the unit
starts, and a value rotated in between (an operator's cron, say) would reach
the job without being among the values redacted from its output.

The job must run as an account other than the requester's (`not_the_requester`,
issue 51): the credentials directory belongs to the job's uid.

Only service containment has a credentials directory: in scope or
process-group mode a job with credentials is refused (a private tmpfs per
job would need a mount namespace the runner does not make there).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airlock.common import binary
from airlock.common.containment import Containment
from airlock.common.errors import AirlockError, ErrorCode
from airlock.runner.jobspec import JobSpec

# systemd's credential names: no "/", at most 255; airlock keeps them plain.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
MAX_BYTES = 1024 * 1024  # systemd's CREDENTIAL_SIZE_MAX
MIN_BYTES = 4  # shorter values would be redacted out of ordinary output everywhere


def unsafe(name: str, path: str, why: str) -> AirlockError:
    return AirlockError(
        ErrorCode.CREDENTIAL_UNSAFE,
        f"credential {name!r} ({path}) {why}: a credential file must be a regular file that root alone can change",
        {"credential": name, "path": path},
    )


def parse_bound(untrusted: Any, stages: int) -> list[dict[str, str]]:
    """``bound["credentials"]``: one ``{name: absolute path}`` per stage, each checked again."""
    if untrusted is None:
        return []
    if not isinstance(untrusted, list) or len(untrusted) != stages:
        raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "bound.credentials must name each stage's credentials")
    out: list[dict[str, str]] = []
    for stage in untrusted:
        if not isinstance(stage, dict):
            raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "bound.credentials: each stage's is a mapping")
        for name, path in stage.items():
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "bound.credentials: a credential name is invalid")
            if not isinstance(path, str) or not path.startswith("/") or "\0" in path or ":" in path:
                raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "bound.credentials: a path is invalid")
        out.append(dict(stage))
    return out


def read_value(name: str, path: str) -> bytes:
    """The credential's bytes, read through an fd opened without following a symlink; refused if unsafe."""
    try:
        held, _st = binary.open_binary(path, trusted=True)
    except AirlockError as exc:
        # open_binary speaks of binaries: say it of a credential.
        why = exc.message.split(": ", 1)[-1].split(";", 1)[0]
        raise unsafe(name, path, why) from None
    try:
        fd = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise unsafe(name, path, f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(held)
    try:
        chunks = []
        size = 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    value = b"".join(chunks)
    if len(value) > MAX_BYTES:
        raise unsafe(name, path, f"is larger than {MAX_BYTES} bytes")
    if len(value.strip()) < MIN_BYTES:
        raise unsafe(name, path, f"holds fewer than {MIN_BYTES} bytes (it could not be told apart from output)")
    return value


@dataclass(frozen=True, slots=True)
class Loaded:
    """Every stage's credentials as read: (stage, name, path, value)."""

    items: tuple[tuple[int, str, str, bytes], ...] = ()

    def record(self) -> list[dict[str, Any]]:
        """What ``exec.started`` says: names and digests, never a value."""
        return [
            {"stage": stage, "name": name, "sha256": hashlib.sha256(value).hexdigest()}
            for stage, name, _path, value in self.items
        ]

    def redacted(self) -> tuple[bytes, ...]:
        """The values to redact, each without its trailing newline.

        The file's line end is not the secret: redacting it too joined the
        line after the value to ``[redacted]`` (issue 44).  The value without it
        covers both ``cat file`` and ``$(cat file)``.
        """
        values = {value.rstrip(b"\r\n") or value for *_, value in self.items}
        return tuple(sorted(values))

    def apply(self, job: JobSpec) -> JobSpec:
        if not self.items:
            return job
        per_stage: list[tuple[tuple[str, bytes], ...]] = [() for _ in job.stages]
        for stage, name, _path, value in self.items:
            per_stage[stage] += ((name, value),)
        return dataclasses.replace(
            job, protected_values=(*job.protected_values, *self.redacted()), credentials=tuple(per_stage)
        )


def not_the_requester(job_uid: int, requester_uid: int | None) -> None:
    """A re-check (issue 51): the job must run as an account other than the requester's.

    systemd's copy in ``$CREDENTIALS_DIRECTORY`` belongs to the job's uid; a job
    that runs as the agent itself would hand the value to every other process
    of the agent.  Policy load refuses such a rule already; this is the
    runner's own check, made before any value is read.
    """
    if requester_uid is None or job_uid == requester_uid:  # unknown: fail closed
        raise AirlockError(
            ErrorCode.CREDENTIAL_UNSAFE,
            f"this rule's credentials would be readable by the requester: the job runs as the requester's own "
            f"uid {requester_uid}; credentials go only to jobs that run as another account (privileged: true)",
            {"uid": requester_uid},
        )


def load(untrusted_bound: Any, job: JobSpec) -> Loaded:
    """Check and read the credentials approval bound for ``job``; refused outside service containment."""
    bound = untrusted_bound.get("credentials") if isinstance(untrusted_bound, Mapping) else None
    stages = parse_bound(bound, len(job.stages))
    if not any(stages):
        return Loaded()
    not_the_requester(job.identity.uid, job.owner_uid)
    items = []
    for index, stage in enumerate(stages):  # an unsafe file is refused as such, in any containment
        for name, path in sorted(stage.items()):
            items.append((index, name, path, read_value(name, path)))
    if job.containment is not Containment.SERVICE:
        raise AirlockError(
            ErrorCode.SPAWN_FAILED,
            "this rule's credentials need runner.containment: service (systemd's LoadCredential=), not "
            + job.containment,
        )
    return Loaded(tuple(items))
