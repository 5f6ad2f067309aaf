"""The end record always fits, or the job never starts (issue 29): `end_record_fits`."""

from __future__ import annotations

import hashlib
import os

import pytest

from airlock.common.containment import Containment
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.kinds import MAX_PAYLOAD_BYTES
from airlock.runner.endrecord import end_record_fits
from airlock.runner.identity import resolve_identity
from airlock.runner.spawn import JobSpec


def _job(stages: tuple[tuple[str, ...], ...], cwd: str = "/") -> JobSpec:
    return JobSpec(
        operation_id="op-1",
        mode="exec",
        stages=stages,
        identity=resolve_identity(os.getuid()),
        env={},
        cwd=cwd,
        stdin=None,
        timeout_seconds=1,
        deadline=None,
        max_output_bytes=16,
        kill_grace_seconds=1,
        protected_values=(),
        containment=Containment.PROCESS_GROUP,
        binaries=tuple({"path": "/usr/bin/true"} for _ in stages),
    )


@pytest.mark.parametrize("size", [60_000, 64_800, 900_000])
def test_argv_does_not_grow_the_end_record(size: int) -> None:
    # argv is named by digest: any argv the request could carry leaves the end record small
    assert end_record_fits(_job((("/usr/bin/true", "x" * size),)), 0) < 4096


def test_the_longest_pipeline_fits_with_no_output_head() -> None:
    assert end_record_fits(_job(tuple(("/usr/bin/true",) for _ in range(64))), 0) <= MAX_PAYLOAD_BYTES


def test_an_end_record_that_could_overflow_is_refused_naming_its_size() -> None:
    with pytest.raises(AirlockError) as caught:
        end_record_fits(_job(tuple(("/usr/bin/true",) for _ in range(64))), 48 * 1024)
    exc = caught.value
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.details["end_record_bytes"] > MAX_PAYLOAD_BYTES == exc.details["limit_bytes"]
    assert f"over the audit journal's limit of {MAX_PAYLOAD_BYTES}" in exc.message


def test_exec_started_spells_out_a_small_argv_and_names_a_large_one_by_digest() -> None:
    from airlock.common.codec import canonical_json
    from airlock.runner.endrecord import argv_digest, spec_record

    big = ["/usr/bin/true", "x" * 2000]
    spec = {"stages": [["/usr/bin/echo", "hi"], big], "stdin": "A" * 4000, "cwd": "/"}
    record = spec_record(spec)
    assert record["stages"][0] == ["/usr/bin/echo", "hi"]
    assert record["stages"][1] == {"argv_sha256": argv_digest(big), "argv_bytes": len(canonical_json(big))}
    assert record["stdin"]["bytes"] == 3000 and record["cwd"] == "/"  # the bytes the job reads, not the base64
    # Issue 45: stdin is content; even a small one is named by size and sha256 only.
    assert spec_record({"stages": [["/usr/bin/true"]], "stdin": "cm9vdDpzM2NyZXQK"})["stdin"] == {
        "bytes": 12,
        "sha256": hashlib.sha256(b"root:s3cret\n").hexdigest(),
    }
    assert spec_record({"stages": [["true"]], "stdin": None}) == {"stages": [["true"]], "stdin": None}
