"""`airlock dev up`: the whole stack in the foreground, activated as systemd would.

The supervisor binds every socket under the runtime folder, starts the four
services and the exec-tree listener (airlock-exectree) as children and hands each its sockets through LISTEN_FDS,
LISTEN_FDNAMES and LISTEN_PID (fds from 3 on, exactly as systemd does), and
waits for each READY=1 on a notify socket of its own.  A service that dies is
started again, like ``Restart=on-failure``; the sockets stay bound meanwhile,
so clients queue instead of failing.  A service that exits cleanly (exit 0: an
idle exit, or a SIGTERM from outside) is started again when one of its
sockets has a connection waiting, as its systemd socket unit would.  Ctrl-C
or SIGTERM stops them all.  The config and the policy are checked before
anything starts: an error is printed here, with its ``path:line:col``.

With ``--web HOST:PORT``, airlock-web (``airlock.web``) runs too, handed its
listening TCP socket as systemd's airlock-web.socket would hand it; ``web.url``
defaults to ``http://localhost:PORT`` (a secure context for WebAuthn without
TLS, and the passkeys' relying party ID ``localhost``).

When ``notify.channels`` is not empty, the relay (``airlock.relay``, the
airlock-notify service) runs too, with no socket of its own, following the
stack's own operator socket (it calls only the verbs an observer may; here it
runs as the invoking user, who is an operator too); it is restarted when it
fails.  Its READY=1 follows an answer through approval from the journal, so it
is waited for after the services, with its own bound, and socket activation
goes on meanwhile (`Supervisor.wait_ready`).

Built-in dev config: the invoking user is agent and operator and runs every
service; unprivileged requests from that user are allowed.  A ``--config``
file overrides it key by key, but state, logs and sockets always stay under
the runtime folder.

The runtime folder is trusted with root's power when dev up runs as root:
`airlock.cli.devdir` makes it safe in a shared ``/tmp`` (issue 39).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from airlock.cli.devdir import UnsafeRuntimeDir, open_log, prepare_runtime_dir, write_private
from airlock.common import config as configuration
from airlock.common.activation import DOORS, RELAY_READY_SECONDS
from airlock.common.child import environment, stop_all
from airlock.common.weblisten import bind_web

SERVICES = ("journal", "approval", "exectree", "runner", "intake")
# The folder holding the `airlock` package this process imported (services/ in a checkout).
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_UCRED = struct.Struct("3i")
# On stop, how long the services have between SIGTERM and SIGKILL (their own stop takes at most 20 s).
STOP_GRACE_SECONDS = 25.0


def dev_config_dict(runtime_dir: Path, user: str) -> dict[str, Any]:
    return {
        "paths": {
            "runtime_dir": str(runtime_dir),
            "state_dir": str(runtime_dir / "state"),
            "policy_dir": str(runtime_dir / "policy.d"),
        },
        "agents": {"users": [user], "groups": []},
        "operators": {"users": [user], "groups": []},
        "services": {
            "intake_user": user,
            "approval_user": user,
            "journal_user": user,
            "runner_user": user,
            "idle_exit_seconds": 0,  # stay up; with --config setting it, dev up restarts on demand
        },
        "approval": {
            "allow_self_approval": True,
            # Issue 33: the enrolled passkeys (written by the dev runner) and approval's counters.
            "passkeys": str(runtime_dir / "passkeys"),
            "state_dir": str(runtime_dir / "state" / "approval"),
        },
        # The checkpoint key, made here at the first start (the package makes /etc/airlock's at install).
        "journal": {"checkpoint_key": str(runtime_dir / "checkpoint_ed25519_key")},
        "runner": {"containment": "process-group", "output_dir": str(runtime_dir / "state" / "output")},
        "policy": {
            "default": "ask",
            "rules": [
                {
                    "name": "dev-unprivileged",
                    "decision": "allow",
                    "users": [user],
                    "privileged": False,
                }
            ],
        },
    }


def check_policy(cfg: configuration.Config, user_file: Path | None) -> None:
    """Load the policy as approval will, so its errors are reported here (raises `PolicyError`).

    A ``policy:`` section of the user's file is checked as that file, so the
    errors name its lines rather than those of the composed copy.
    """
    from airlock.approval.policy import load_policy

    if user_file is not None:
        mine = configuration.parse_text(user_file.read_text(encoding="utf-8"), str(user_file))
        if mine.policy_node is not None:
            cfg = dataclasses.replace(cfg, source=mine.source, policy_node=mine.policy_node)
    for warning in load_policy(cfg).warnings:
        print(f"airlock dev: policy warning: {warning}", file=sys.stderr)


def compose_config(runtime_dir: Path, user_file: Path | None, web_port: int | None = None) -> str:
    """The dev config as YAML: built-in dev values, the user's file over them key by key."""
    merged = dev_config_dict(runtime_dir, pwd.getpwuid(os.getuid()).pw_name)
    if web_port is not None:
        merged["web"] = {"url": f"http://localhost:{web_port}"}
    if user_file is not None:
        text = user_file.read_text(encoding="utf-8")
        configuration.parse_text(text, str(user_file))  # validate with exact messages first
        overrides = yaml.safe_load(text) or {}
        for section, values in overrides.items():
            if section == "policy":
                merged["policy"] = values
            elif isinstance(values, dict):
                merged.setdefault(section, {}).update(values)
    # State, logs and sockets always stay under the runtime folder.
    merged["paths"].update(
        runtime_dir=str(runtime_dir), state_dir=str(runtime_dir / "state"), policy_dir=str(runtime_dir / "policy.d")
    )
    merged.setdefault("notify", {}).update(state_dir=str(runtime_dir / "state" / "notify"))
    merged.setdefault("approval", {}).update(
        passkeys=str(runtime_dir / "passkeys"), state_dir=str(runtime_dir / "state" / "approval")
    )
    return "# Written by `airlock dev up`; edit the file given with --config instead.\n" + yaml.safe_dump(
        merged, sort_keys=False
    )


@dataclass
class Child:
    name: str
    sockets: list[tuple[str, socket.socket]]
    module: str = ""  # default: `python -m airlock.entry NAME` (the command airlock-NAME runs)
    proc: subprocess.Popen[bytes] | None = None
    ready: bool = False
    restarts: list[float] = field(default_factory=list)
    # Exited cleanly: started again by the next connection to one of its sockets.
    idle: bool = False
    args: tuple[str, ...] = ()  # after --config


class Supervisor:
    def __init__(self, runtime_dir: Path, config_path: Path, web: list[socket.socket] | None = None) -> None:
        self.runtime_dir = runtime_dir
        self.web = web or []
        self.config_path = config_path
        self.children: dict[str, Child] = {}
        self.stopping = False
        self.notify_path = runtime_dir / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.logs = runtime_dir / "logs"

    def bind(self, cfg: configuration.Config) -> None:
        listening: dict[str, socket.socket] = {}
        for names in DOORS.values():
            for name in names:
                path = cfg.socket_path(name)
                path.unlink(missing_ok=True)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(str(path))
                os.chmod(path, 0o600 if name != "agent" else 0o660)
                sock.listen(128)
                listening[name] = sock
        for service in SERVICES:
            self.children[service] = Child(service, [(n, listening[n]) for n in DOORS[service]])
        if cfg.notify.channels:
            # The relay (airlock-notify): no sockets, not socket-activated; restarted when it fails.
            self.children["notify"] = Child("notify", [], module="airlock.relay")
        if self.web:
            # airlock-web, handed its TCP sockets as airlock-web.socket would (restarted when it fails).
            self.children["web"] = Child("web", [("web", s) for s in self.web], module="airlock.web", args=("--dev",))
        self.notify_path.unlink(missing_ok=True)
        self.notify.bind(str(self.notify_path))
        self.notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def start(self, child: Child) -> None:
        fds = [sock.fileno() for _, sock in child.sockets]
        names = ":".join(name for name, _ in child.sockets)
        # Rebuilt, as systemd gives a service a clean environment: nothing of this shell's
        # (no JOURNAL_STREAM either: logs go to files here, not journald).
        env = environment(
            LISTEN_FDS=str(len(fds)),
            LISTEN_FDNAMES=names,
            NOTIFY_SOCKET=str(self.notify_path),
            # The services run the code this dev up runs (the same tree, whatever the venv's
            # editable install points at): bench/exec_ab.py compares two trees this way.
            PYTHONPATH=PACKAGE_ROOT,
        )

        def place_fds() -> None:
            # In the child: move the sockets to 3, 4, ... as systemd does, with
            # systemd's default UMask (dev up's own 077 is for its files).
            os.umask(0o022)
            high = [os.dup(fd) for fd in fds]
            for i, fd in enumerate(high):
                os.dup2(fd, 3 + i, inheritable=True)
                os.close(fd)

        log = open_log(self.logs / f"{child.name}.log")
        # LISTEN_PID must be the service's own pid, known only after fork:
        # sh sets it to $$ and execs the service in the same process.
        argv = [
            "/bin/sh",
            "-c",
            'LISTEN_PID=$$ exec "$0" "$@"',
            sys.executable,
            "-m",
            child.module or "airlock.entry",
            *(child.args if child.module else (child.name, *child.args)),
            "--config",
            str(self.config_path),
        ]
        child.proc = subprocess.Popen(  # noqa: S603  our own interpreter and module; the config path is ours
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=tuple(range(3, 3 + len(fds))),
            preexec_fn=place_fds,
            close_fds=True,
        )
        os.close(log)
        child.ready = False

    def wait_ready(self, timeout: float, children: list[Child]) -> bool:
        """Wait up to ``timeout`` for each of ``children`` to say READY=1 (or to have served and idled out).

        Meanwhile a service that idled out is started again when a client
        connects, as in `supervise`: the relay's readiness is an answer
        through approval from the journal, and one of them may idle out
        before the relay asks (issue 44: "notify did not start").
        """
        deadline = time.monotonic() + timeout
        while not all(c.ready for c in children):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.activate(self.poll_notify(min(left, 0.2), self.idle_sockets()))
            for child in self.children.values():  # all of them: one waited for may need one that idles out
                if child.idle or child.proc is None or child.proc.poll() is None:
                    continue
                if child.proc.returncode != 0:
                    return False
                # Exit 0 comes only after serving: with a short idle_exit_seconds a
                # quick service may idle out while a slower one is still starting.
                child.ready = child.idle = True
        return True

    def poll_notify(self, timeout: float, watch: list[socket.socket] | None = None) -> list[socket.socket]:
        """Take one notify message if one comes within ``timeout``; return which ``watch`` sockets are readable."""
        ready, _, _ = select.select([self.notify, *(watch or [])], [], [], timeout)
        woken = [sock for sock in ready if sock is not self.notify]
        if self.notify not in ready:
            return woken
        data, ancdata, _flags, _addr = self.notify.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
        pid = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = _UCRED.unpack(payload[: _UCRED.size])[0]
        if b"READY=1" in data.split(b"\n"):
            for child in self.children.values():
                if child.proc is not None and child.proc.pid == pid:
                    child.ready = True
        return woken

    def stop(self) -> None:
        """Stop every service, the journal last.

        Each service journals its own stop (and its in-flight requests' last
        records) on its way out.  Stopped all at once, they found journal.sock
        still bound here but no longer served, and each waited out its bound
        (5 s for the stop record, more for a request's) for nothing.  While the
        others stop, an idle-exited journal is started again by a connection, as
        its socket unit would.
        """
        self.stopping = True
        journal = self.children.get("journal")
        self._stop_wave([c for c in self.children.values() if c is not journal], journal)
        if journal is not None:
            self._stop_wave([journal], None)

    def _stop_wave(self, children: list[Child], serving: Child | None) -> None:
        """SIGTERM to ``children``, up to STOP_GRACE_SECONDS, SIGKILL; ``serving`` is kept up meanwhile."""
        running = [c.proc for c in children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while any(proc.poll() is None for proc in running) and time.monotonic() < deadline:
            if serving is not None and serving.proc is not None and serving.proc.poll() is not None:
                serving.idle = True  # it exited meanwhile: the next connection starts it again
            idle = [sock for _, sock in serving.sockets] if serving is not None and serving.idle else []
            if self.poll_notify(0.05, idle) and serving is not None:
                serving.idle = False
                self.start(serving)
        stop_all(running, 0)

    def idle_sockets(self) -> list[socket.socket]:
        """The listening sockets of the services that idled out: readable when a client connects."""
        return [sock for child in self.children.values() if child.idle for _, sock in child.sockets]

    def activate(self, woken: list[socket.socket]) -> None:
        """Start again each idled-out service a client is waiting for, as its socket unit would."""
        for child in self.children.values():
            if child.idle and not self.stopping and any(sock in woken for _, sock in child.sockets):
                child.idle = False
                self.start(child)

    def supervise(self) -> None:
        while not self.stopping:
            woken = self.poll_notify(0.5, self.idle_sockets())
            self.activate(woken)
            for child in self.children.values():
                if self.stopping:
                    break
                if child.idle:
                    continue
                proc = child.proc
                if proc is None or proc.poll() is None:
                    continue
                if proc.returncode == 0:
                    # An idle exit (or a clean stop from outside) is not a failure: as with
                    # systemd's socket units, the next connection starts it again.
                    print(
                        f"airlock dev: {child.name} exited cleanly; it starts again on its next connection",
                        file=sys.stderr,
                    )
                    child.idle = True
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 30] + [now]
                if len(child.restarts) > 5:
                    print(f"airlock dev: {child.name} keeps failing; see {self.logs / child.name}.log", file=sys.stderr)
                    self.stopping = True
                    return
                print(f"airlock dev: {child.name} exited ({proc.returncode}); starting it again", file=sys.stderr)
                self.start(child)


def make_checkpoint_key(key: Path) -> None:
    """The journal's checkpoint key (ed25519, 0600, the invoking user's, who runs every service here), if missing.

    Like the package's postinst for /etc/airlock's key; without ssh-keygen the
    journal's anchors go unsigned and its log says so.
    """
    if key.exists():
        return
    from airlock.common import sshsig  # not before: its helpers' asyncio is ~15 ms before the services start

    if not sshsig.available():
        return
    comment = f"airlock-checkpoint@{socket.gethostname()}"
    subprocess.run(  # noqa: S603  ssh-keygen by absolute path; the key path is our own runtime folder's
        [sshsig.SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        timeout=30,
        check=False,
    )


def up(runtime_dir: Path, user_config: Path | None, web: str | None = None) -> int:
    runtime_dir = runtime_dir.absolute()
    os.umask(0o077)  # the config (it may hold notify secrets), logs and folders are the invoking user's alone
    config_path = runtime_dir / "airlock.yaml"
    from airlock.approval.policy import PolicyError

    web_sockets: list[socket.socket] = []
    try:
        if web is not None:
            web_sockets = bind_web(web)
        prepare_runtime_dir(runtime_dir)
        text = compose_config(runtime_dir, user_config, web_sockets[0].getsockname()[1] if web_sockets else None)
        cfg = configuration.parse_text(text, str(config_path))
        check_policy(cfg, user_config)
        write_private(config_path, text)
    except (configuration.ConfigError, PolicyError, OSError, UnsafeRuntimeDir, ValueError) as exc:
        for line in str(exc).splitlines():
            print(f"airlock dev: {line}", file=sys.stderr)
        return 2
    make_checkpoint_key(cfg.journal.checkpoint_key)  # in the runtime folder prepared above: ours alone
    supervisor = Supervisor(runtime_dir, config_path, web_sockets)

    def on_signal(signum: int, _frame: Any) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    supervisor.bind(cfg)
    for child in supervisor.children.values():
        supervisor.start(child)
    # The services first; then the relay (and web), whose readiness is the services' answer: it has its own bound,
    # which a shared 30 s did not leave it under load (issue 44).
    services = [c for c in supervisor.children.values() if c.name in SERVICES]
    others = [c for c in supervisor.children.values() if c.name not in SERVICES]
    if not supervisor.wait_ready(30, services) or not supervisor.wait_ready(RELAY_READY_SECONDS + 10, others):
        failed = [c.name for c in supervisor.children.values() if not c.ready]
        print(f"airlock dev: {', '.join(failed)} did not start; see {supervisor.logs}/", file=sys.stderr)
        supervisor.stop()
        return 1
    web_at = ""
    if web_sockets:
        host, port = web_sockets[0].getsockname()[:2]
        web_at = f" web={cfg.web.url or '-'} web_listen={host}:{port}"
    print(
        f"airlock dev: ready agent={cfg.socket_path('agent')} operator={cfg.socket_path('operator')}{web_at} "
        f"logs={supervisor.logs}/ (Ctrl-C stops)",
        flush=True,
    )
    if os.geteuid() != 0:
        print(
            "airlock dev: not root: privileged requests will be refused (use --no-privilege)",
            file=sys.stderr,
            flush=True,
        )
    try:
        supervisor.supervise()
    finally:
        supervisor.stop()
        print("airlock dev: stopped", file=sys.stderr, flush=True)
    return 0
