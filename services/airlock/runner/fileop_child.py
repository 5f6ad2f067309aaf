"""The file-operations entry point: one file operation per fresh process.

The runner starts it through `spawn.run_job`, exactly as it starts an exec
job (same identity switch before exec, containment, timeout, cancel and
output cap), with ``python3 -I -B`` and the request as JSON on stdin:
``{"spec": FileSpec.to_dict(), "preview": bool, "expect": "absent" | sha256 | null,
"cpu_seconds": int | null}``.  It answers with one JSON outcome on stdout
(`fileop_perform.perform`) and exits 0; anything else (a crash, a signal) is the
runner's to report.

``cpu_seconds`` sets RLIMIT_CPU (soft, and hard one second later) before
any work: a catastrophic regular expression is stopped by the kernel with
SIGXCPU, then SIGKILL.  Imports are the standard library and the pure
`common.fileop_spec` only, so the entry point needs nothing from the runner's
virtual environment.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

from airlock.common.errors import AirlockError
from airlock.common.fileop_spec import FileSpec
from airlock.runner import fileop_perform, fileop_write

REQUEST_LIMIT = 8 * 1024 * 1024


def _request(raw: bytes) -> tuple[FileSpec, bool, str | None, int | None]:
    untrusted: Any = json.loads(raw)
    if not isinstance(untrusted, dict):
        raise ValueError("the request must be an object")
    spec = FileSpec.from_dict(untrusted.get("spec"))
    preview = untrusted.get("preview") is True
    expect = untrusted.get("expect")
    if expect is not None and not (expect == fileop_write.ABSENT or (isinstance(expect, str) and len(expect) == 64)):
        raise ValueError("expect must be absent or a sha256")
    cpu = untrusted.get("cpu_seconds")
    if cpu is not None and (not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 1):
        raise ValueError("cpu_seconds must be a positive integer")
    return spec, preview, expect, cpu


def main() -> int:
    try:
        spec, preview, expect, cpu = _request(sys.stdin.buffer.read(REQUEST_LIMIT))
    except (ValueError, AirlockError) as exc:
        print(f"airlock-fileop: bad request: {exc}", file=sys.stderr)
        return 2
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    os.umask(0o022)
    outcome = fileop_perform.perform(spec, preview_only=preview, expect=expect)
    data = json.dumps(outcome, separators=(",", ":")).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
    return 0


if __name__ == "__main__":
    sys.exit(main())
