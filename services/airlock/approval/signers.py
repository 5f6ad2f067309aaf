"""Signed approvals: who signed, checked by OpenSSH's own ``ssh-keygen -Y``.

airlock-approval runs ``ssh-keygen`` itself, as its own user inside its
sandbox (no network, no home, read-only /etc): ``-Y find-principals`` names
the principal whose key made the signature, then ``-Y verify -f
ALLOWED_SIGNERS -I PRINCIPAL -n airlock-approval`` checks it over the exact
statement bytes (on stdin).  The signature goes in through a sealed memfd
(``-s /proc/self/fd/N``, `common.sshsig.sealed`), so nothing is written to disk.  Each run has a
deadline (`RUN_SECONDS`) and at most `MAX_RUNNING` run at once, so a flood of
signatures cannot become a flood of processes.  Environment rebuilt from
scratch (PATH, LANG), stdin the statement or /dev/null, always waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from airlock.approval.statement import NAMESPACE, Signature, allowed_principals
from airlock.common import log, sshsig
from airlock.common.errors import AirlockError, ErrorCode

SSH_KEYGEN = sshsig.SSH_KEYGEN
RUN_SECONDS = 10.0
MAX_RUNNING = 4
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True, slots=True)
class Signer:
    principal: str
    fingerprint: str
    key_type: str


class Signers:
    def __init__(self, allowed_signers: Path) -> None:
        self.path = allowed_signers
        self._slots = asyncio.Semaphore(MAX_RUNNING)
        self.log = log.get()

    def enabled(self) -> bool:
        return self.path.is_file()

    def require(self) -> None:
        if not self.enabled():
            raise AirlockError(
                ErrorCode.UNAUTHORIZED,
                f"signed approvals are off: no allowed_signers file at {self.path} (approval.allowed_signers)",
            )
        if not os.access(self.path, os.R_OK):
            # Otherwise every signature would look like a wrong key.
            self.log.error("approval.signers.unreadable", path=str(self.path))
            raise AirlockError(
                ErrorCode.INTERNAL,
                f"{self.path} is not readable by the approval service's user (make it root:airlock-approval 0640)",
            )
        if not os.path.exists(SSH_KEYGEN):
            raise AirlockError(ErrorCode.INTERNAL, f"{SSH_KEYGEN} is missing: install openssh-client")

    async def principals(self, signature: Signature) -> list[str]:
        """The principals allowed_signers lists for the key that made ``signature`` (none: empty)."""
        code, out = await self._run(["-Y", "find-principals", "-f", str(self.path)], signature, None)
        if code != 0:
            return []
        return [line.strip() for line in out.splitlines() if line.strip()]

    async def verify(self, signature: Signature, principal: str, message: bytes) -> bool:
        """Whether ``signature`` is ``principal``'s, in namespace airlock-approval, over exactly ``message``."""
        code, _ = await self._run(
            ["-Y", "verify", "-f", str(self.path), "-I", principal, "-n", NAMESPACE], signature, message
        )
        return code == 0

    def principal_known(self, principal: str) -> bool:
        """Whether allowed_signers names ``principal`` at all (only to word a refusal)."""
        import fnmatch

        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return any(fnmatch.fnmatchcase(principal, pattern) for pattern in allowed_principals(text))

    async def _run(self, args: list[str], signature: Signature, stdin: bytes | None) -> tuple[int, str]:
        try:
            with sshsig.sealed(signature.armored.encode("ascii")) as fd:
                argv = [SSH_KEYGEN, *args, "-s", f"/proc/self/fd/{fd}"]
                async with self._slots:
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        env=dict(_ENV),
                        pass_fds=(fd,),
                        start_new_session=True,
                    )
                    try:
                        out, err = await asyncio.wait_for(proc.communicate(stdin), RUN_SECONDS)
                    except TimeoutError:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        await proc.wait()
                        self.log.error("approval.signature.timed_out", verb=args[1], seconds=RUN_SECONDS)
                        raise AirlockError(
                            ErrorCode.INTERNAL, f"ssh-keygen did not answer within {RUN_SECONDS:g}s"
                        ) from None
        except OSError as exc:
            self.log.error("approval.signature.spawn_failed", error=str(exc))
            raise AirlockError(ErrorCode.INTERNAL, f"could not run {SSH_KEYGEN}: {exc.strerror}") from None
        code = proc.returncode if proc.returncode is not None else -1
        self.log.info(
            "approval.signature.checked", verb=args[1], exit_code=code, stderr=err.decode("utf-8", "replace")[:512]
        )
        return code, out.decode("utf-8", "replace")
