"""A booted Debian 12 container for the system tests.

The root is built once with debootstrap and cached outside the checkout
(``$AIRLOCK_SYSTEST_DIR``, default /var/tmp/airlock-systest/bookworm); every
run boots a fresh copy of it (``cp -a --reflink=auto``), so runs start clean
and the cache is never written to.  The container is booted with
``systemd-nspawn --register=no --keep-unit -b`` (no systemd needed on the
host) and driven with ``nsenter -t <container PID 1> -a``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

CACHE_DIR = Path(os.environ.get("AIRLOCK_SYSTEST_DIR", "/var/tmp/airlock-systest"))
SUITE = "bookworm"
MIRROR = os.environ.get("AIRLOCK_SYSTEST_MIRROR", "http://deb.debian.org/debian")
# What the cached root holds besides minbase: a booting systemd, the system
# bus, and airlock's dependencies (so installing the .deb needs no download).
INCLUDE = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-yaml",
    "python3-systemd",
    "python3-structlog",
    "python3-sdnotify",
    "python3-dbus",
    "python3-aiohttp",  # airlock-web (issue 33)
    "python3-fido2",  # passkeys, verified in approval (issue 33)
    # debootstrap does not resolve virtual packages: python3-cryptography (fido2's) depends on
    # python3-cffi-backend-api-min/-max, which only python3-cffi-backend provides (issue 44).
    "python3-cffi-backend",
    "procps",
)
HOST_TOOLS = {"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap", "nsenter": "util-linux"}
# Commands inside the container get a clean environment: never the host's
# PATH (a pyenv shim), never pytest's variables.
CLEAN_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0")


# Roots this process built from scratch (test_0_root audits such a root instead of building another).
BUILT_THIS_RUN: set[Path] = set()


class Unavailable(Exception):
    """The system tests cannot run here; the message says why."""


def _log(message: str) -> None:
    print(f"[systest] {message}", flush=True)


def host_tools() -> None:
    if os.geteuid() != 0:
        raise Unavailable("system tests boot a container with systemd-nspawn and need root")
    missing = [pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None]
    if missing:
        raise Unavailable(f"missing host tools; as root run: apt-get install {' '.join(sorted(set(missing)))}")


def root_recipe() -> str:
    """What the cached root is built from; a root built from another recipe is built again."""
    return f"{SUITE} {MIRROR} minbase {' '.join(sorted(INCLUDE))}"


def build_root(dest: Path, log: Path) -> None:
    """debootstrap a Debian 12 root into ``dest`` (which must not exist); raise Unavailable if it fails.

    A failed debootstrap leaves unconfigured packages behind and still looks like a root: the
    result is checked with dpkg's own audit, and every package asked for must be installed.
    """
    with open(log, "w") as out:
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(dest), MIRROR],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            check=False,
            timeout=1800,
        )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise Unavailable(f"debootstrap failed ({proc.returncode}); see {log}:\n" + "\n".join(tail))
    problems = root_problems(dest)
    if problems:
        raise Unavailable(f"debootstrap left a broken root in {dest}: {problems}")


def root_problems(root: Path) -> str:
    """What dpkg says is wrong with ``root``, and which asked-for packages are missing; '' if none."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    audit = subprocess.run(
        ["dpkg", f"--root={root}", "--audit"], capture_output=True, text=True, env=env, check=False, timeout=120
    )
    status = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", *INCLUDE],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    installed = {line.split()[0] for line in status.stdout.splitlines() if line.split()[1:2] == ["ii"]}
    missing = sorted(set(INCLUDE) - installed)
    said = audit.stdout.strip() + audit.stderr.strip()
    return "; ".join(
        part for part in (said and f"dpkg --audit: {said}", missing and f"not installed: {missing}") if part
    )


def cannot_run(reason: object) -> NoReturn:
    """Skip where the system tests cannot run; fail where they could and did not.

    Without root or the host tools the tests skip and say why.  As root with the tools present
    a missing root, package or boot is a failure: a suite that skipped there has not passed
    (issue 44: an unbuildable root once skipped all 79 tests and CI passed).
    """
    try:
        host_tools()
    except Unavailable as missing:
        pytest.skip(str(missing))
    pytest.fail(f"the system tests could not run on a host that has root and every tool: {reason}", pytrace=False)


def cached_root() -> Path:
    """The cached Debian 12 root, built with debootstrap the first time (and again when its recipe changes)."""
    root = CACHE_DIR / SUITE
    stamp = CACHE_DIR / "debootstrap.status"
    recipe = CACHE_DIR / "debootstrap.recipe"
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one debootstrap at a time
        if (
            root.is_dir()
            and stamp.exists()
            and stamp.read_text().strip() == "done"
            and recipe.exists()
            and recipe.read_text().strip() == root_recipe()
        ):
            return root
        _log(f"building the cached Debian 12 root in {root} (debootstrap, once)")
        partial = CACHE_DIR / f"{SUITE}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        build_root(partial, CACHE_DIR / "debootstrap.log")
        partial.rename(root)
        recipe.write_text(root_recipe() + "\n")
        stamp.write_text("done\n")
        BUILT_THIS_RUN.add(root)
        return root


def cached_variant(packages: Sequence[str]) -> Path:
    """The cached root plus ``packages`` (installed with apt once), cached beside it.

    The variant is named and stamped by its package list and by the base
    root's stamp time, so a new list or a rebuilt base builds it again and
    every other run copies it: CI downloads the packages once per cache, not
    per run.  The base itself is never written to.
    """
    base = cached_root()
    wanted = " ".join(sorted(set(packages)))
    tag = hashlib.sha256(wanted.encode()).hexdigest()[:12]
    root = CACHE_DIR / f"{SUITE}+{tag}"
    stamp = CACHE_DIR / f"{SUITE}+{tag}.status"
    expected = f"done {int((CACHE_DIR / 'debootstrap.status').stat().st_mtime)} {wanted}"
    with open(CACHE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root.is_dir() and stamp.exists() and stamp.read_text().strip() == expected:
            return root
        _log(f"building the cached root variant {root.name} with {wanted} (once)")
        partial = CACHE_DIR / f"{SUITE}+{tag}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(partial)], check=True)
        log = CACHE_DIR / f"{SUITE}+{tag}.log"
        apt = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends " + wanted
        # The base's package lists first (no download of lists); if they are stale, fetch them once.
        script = f"{apt} || {{ apt-get update -q && {apt}; }}; rc=$?; apt-get clean; exit $rc"
        with open(log, "w") as out:
            proc = subprocess.run(
                [
                    "systemd-nspawn",
                    "-q",
                    "-D",
                    str(partial),
                    "-M",
                    f"airlock-variant-{os.getpid()}",
                    "--register=no",
                    "--keep-unit",
                    "--pipe",
                    "--",
                    "sh",
                    "-c",
                    script,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
                check=False,
                timeout=900,
            )
        if proc.returncode != 0:
            raise Unavailable(
                f"installing {wanted} into a copy of the cached root failed ({proc.returncode}); see {log}"
            )
        partial.rename(root)
        stamp.write_text(expected + "\n")
        return root


@dataclass
class Result:
    argv: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"$ {shlex.join(self.argv)}\n-> {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


class CommandFailed(AssertionError):
    pass


class Container:
    """One booted copy of the cached root."""

    def __init__(self, root: Path, name: str, nspawn_args: Sequence[str] = ()) -> None:
        self.root = root
        self.name = name
        self.nspawn_args = list(nspawn_args)  # e.g. --network-zone=NAME
        self.console = root.parent / f"{root.name}.console.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0

    # --- lifecycle ---------------------------------------------------------------

    def boot(self, timeout: float = 120.0) -> None:
        with open(self.console, "wb") as console:
            self.proc = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "-D",
                    str(self.root),
                    "-M",
                    self.name,
                    "--register=no",
                    "--keep-unit",
                    "--console=read-only",
                    # nspawn's seccomp filter refuses fanotify; the runner's exec trees come from it
                    # here (the process-events connector serves only the host's namespaces).
                    "--system-call-filter=fanotify_init fanotify_mark",
                    *self.nspawn_args,
                    "-b",
                ],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.leader:
            if self.proc.poll() is not None:
                raise Unavailable(
                    f"systemd-nspawn could not boot the container:\n{self.console.read_text(errors='replace')[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise Unavailable("the container's PID 1 never appeared")
            self.leader = self._find_leader(self.proc.pid)
            time.sleep(0.1)
        # The container's systemd is up when its manager answers; then wait
        # for the boot to finish.  "degraded" is fine: some units of a stock
        # root fail in a container (none of ours), see is_system_running().
        while time.monotonic() < deadline:
            r = self.run(["systemctl", "is-system-running", "--wait"], check=False, timeout=deadline - time.monotonic())
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                self.state = state
                return
            time.sleep(0.2)
        raise Unavailable(f"the container did not finish booting:\n{self.console.read_text(errors='replace')[-3000:]}")

    @staticmethod
    def _find_leader(nspawn_pid: int) -> int:
        """The container's PID 1: the descendant of systemd-nspawn running systemd."""
        todo = [nspawn_pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                    if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                        return int(child)
                    todo.append(int(child))
        return 0

    def shutdown(self, timeout: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # SIGTERM to systemd-nspawn asks the container for a clean poweroff.
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    # --- commands inside ----------------------------------------------------------

    def argv(self, argv: Sequence[str], user: str | None = None) -> list[str]:
        inner = ["env", "-i", *CLEAN_ENV]
        if user is not None:
            inner += [f"HOME=/home/{user}", f"USER={user}", f"LOGNAME={user}"]
            inner += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        else:
            inner += ["HOME=/root"]
        return ["nsenter", "-t", str(self.leader), "-a", "--", *inner, *argv]

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
        input: str | None = None,
    ) -> Result:
        full = self.argv(argv, user)
        try:
            proc = subprocess.run(
                full,
                input=input.encode() if input is not None else None,
                stdin=None if input is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=max(timeout, 1.0),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(f"$ {shlex.join(argv)} (as {user or 'root'}) timed out after {timeout:.0f}s") from exc
        result = Result(
            list(argv), proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        )
        if check and result.returncode != 0:
            raise CommandFailed(f"as {user or 'root'}:\n{result}")
        return result

    def sh(self, script: str, **kwargs: object) -> Result:
        return self.run(["sh", "-c", script], **kwargs)  # type: ignore[arg-type]

    def popen(self, argv: Sequence[str], *, user: str | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv(argv, user), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file inside the container (through the container, not the host path)."""
        self.run(
            ["sh", "-c", f"umask 022; cat > {shlex.quote(path)} && chmod {mode:o} {shlex.quote(path)}"], input=text
        )

    def wait_for(self, argv: Sequence[str], *, timeout: float = 30.0, **kwargs: object) -> Result:
        deadline = time.monotonic() + timeout
        while True:
            r = self.run(argv, check=False, **kwargs)  # type: ignore[arg-type]
            if r.returncode == 0:
                return r
            if time.monotonic() > deadline:
                raise CommandFailed(f"still failing after {timeout:.0f}s:\n{r}")
            time.sleep(0.2)

    def unit_property(self, unit: str, prop: str) -> str:
        return self.run(["systemctl", "show", "-P", prop, unit]).stdout.strip()


def _stale_runs(runs: Path) -> Iterator[Path]:
    """Copies left by runs whose pytest is gone (a crash, a kill -9)."""
    for path in runs.glob("run-*"):
        if not path.is_dir():
            continue
        try:
            pid = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            yield path


@contextlib.contextmanager
def booted(
    keep: bool = False,
    *,
    packages: Sequence[str] = (),
    nspawn_args: Sequence[str] = (),
    name: str = "",
    before_boot: Callable[[Path], None] | None = None,
) -> Iterator[Container]:
    """A fresh copy of the cached root, booted; shut down and removed afterwards.

    ``packages``: boot a copy of `cached_variant` instead; ``nspawn_args``
    (e.g. a network zone), ``name`` (a suffix telling several containers
    apart, also their hostname) and ``before_boot`` (given the copy's root)
    serve tests with more than one container.
    """
    host_tools()
    base = cached_variant(packages) if packages else cached_root()
    runs = CACHE_DIR / "runs"
    runs.mkdir(exist_ok=True)
    for stale in _stale_runs(runs):
        shutil.rmtree(stale, ignore_errors=True)
    root = runs / f"run-{os.getpid()}-{int(time.time())}{'-' + name if name else ''}"
    started = time.monotonic()
    subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(root)], check=True)
    _log(f"copied the cached root to {root} in {time.monotonic() - started:.1f}s")
    if before_boot is not None:
        before_boot(root)
    container = Container(root, f"airlock-systest-{os.getpid()}{'-' + name if name else ''}", nspawn_args)
    try:
        started = time.monotonic()
        container.boot()
        _log(f"booted ({container.state}) in {time.monotonic() - started:.1f}s; PID 1 is host pid {container.leader}")
        yield container
    finally:
        container.shutdown()
        if keep:
            _log(f"kept {root} (AIRLOCK_SYSTEST_KEEP)")
        else:
            shutil.rmtree(root, ignore_errors=True)
            container.console.unlink(missing_ok=True)
