"""The gate of a scope job's stages: each waits in a small shim until it is
inside the scope, then executes the held binary (spawn.py opens the gates).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Runs in each stage of a scope job: wait at the gate until the stage is inside
# the scope, then exec the real binary with the caller's argv[0].  The gate
# also carries the job's environment: the shim itself starts with an empty one,
# because Python's locale coercion (PEP 538) would add or rewrite LC_CTYPE.
# Python ignores SIGPIPE and SIGXFSZ at start-up and exec keeps ignored signals
# ignored, so they are reset first (subprocess's restore_signals does the same).
_GATE_SHIM = """\
import os, signal, sys
gate = int(sys.argv[1])
chunks = []
while True:
    chunk = os.read(gate, 65536)
    if not chunk:
        break
    chunks.append(chunk)
os.close(gate)
data = b"".join(chunks)
if data[:1] != b"1":
    os._exit(125)
env = dict(item.split(b"=", 1) for item in data[1:].split(b"\\0") if item)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
try:
    os.execve(sys.argv[2], sys.argv[3:], env)
except OSError as exc:
    os.write(2, ("airlock: cannot execute %s: %s\\n" % (sys.argv[2], exc.strerror)).encode())
    os._exit(127 if exc.errno == 2 else 126)
"""


def _gate_payload(env: Mapping[str, str]) -> bytes:
    """What opens a gate: the go byte, then NAME=value entries separated by NUL."""
    return b"1" + b"\0".join(os.fsencode(f"{name}={value}") for name, value in env.items())
