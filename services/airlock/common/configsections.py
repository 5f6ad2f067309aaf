"""The typed configuration's sections: one frozen dataclass per top-level key of airlock.yaml.

A section's fields are its settings' names (``limits.max_request_bytes`` is
``Limits.max_request_bytes``); `config.Config` holds one of each.  Derived
values a reader wants (the per-agent cap in force, the WebAuthn origin) are
properties, computed when read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from airlock.common.channels.base import Channel
from airlock.common.configvalues import Observers, SignerAccounts


@dataclass(frozen=True, slots=True)
class Paths:
    runtime_dir: Path
    state_dir: Path
    policy_dir: Path


@dataclass(frozen=True, slots=True)
class Principals:
    users: tuple[str, ...]
    groups: tuple[str, ...]
    observers: Observers
    max_connections: int
    max_connections_per_user: int

    @property
    def connections_per_user(self) -> int:
        """The per-user cap on operator.sock in force: 0 stands for a quarter of max_connections, at least 1."""
        return self.max_connections_per_user or max(1, self.max_connections // 4)


@dataclass(frozen=True, slots=True)
class Agents:
    users: tuple[str, ...]
    groups: tuple[str, ...]
    require_token: bool
    retry_window_seconds: float = 600.0


@dataclass(frozen=True, slots=True)
class Services:
    intake_user: str
    approval_user: str
    journal_user: str
    runner_user: str
    idle_exit_seconds: float
    stop_timeout_seconds: float


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int
    max_connections: int
    max_connections_per_agent: int
    read_timeout_seconds: float
    write_timeout_seconds: float
    request_timeout_seconds: float
    freshness_seconds: float
    clock_skew_seconds: float
    replay_window_seconds: float
    default_timeout_seconds: float
    max_output_bytes: int
    kill_grace_seconds: float
    search_cpu_seconds: int
    max_total_output_bytes: int = 32 * 1024 * 1024

    @property
    def connections_per_agent(self) -> int:
        """The per-agent cap in force: a setting of 0 stands for a quarter of max_connections.

        Derived when read, not when parsed, so a file that changes only
        max_connections moves the per-agent cap with it.
        """
        return self.max_connections_per_agent or max(1, self.max_connections // 4)


@dataclass(frozen=True, slots=True)
class Env:
    allow: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Approval:
    timeout_seconds: float
    allow_self_approval: bool
    ticket_ttl_seconds: float
    notify_command: tuple[str, ...]
    notify_timeout_seconds: float
    allowed_signers: Path = Path("/etc/airlock/allowed_signers")
    min_reason_length: int = 10
    operator_reason: str = "optional"
    max_grant_seconds: float = 8 * 3600.0
    signer_accounts: SignerAccounts = SignerAccounts()  # noqa: RUF009 (frozen: one shared empty value is safe)
    max_pending_per_agent: int = 10
    asks_per_minute: int = 20
    passkeys: Path = Path("/etc/airlock/passkeys")
    state_dir: Path = Path("/var/lib/airlock-approval")
    # Issue 34: the reviewer tier (approval/reviewer.py; the runner starts it, runner/review.py).
    reviewer_command: tuple[str, ...] = ()
    reviewer_user: str = "airlock-reviewer"
    reviewer_timeout_seconds: float = 10.0
    reviewer_name: str = ""
    reviewer_network: bool = False
    # Issue 45: how long a person's denial keeps grants and the reviewer from allowing the same thing.
    denial_memory_seconds: float = 30 * 86400.0

    @property
    def reviewer_label(self) -> str:
        """The reviewer's name in records and messages: ``reviewer_name``, else its program's file name."""
        if self.reviewer_name:
            return self.reviewer_name
        base = self.reviewer_command[0].rsplit("/", 1)[-1] if self.reviewer_command else ""
        return "".join(c for c in base if c.isalnum() or c in "._-")[:64] or "reviewer"


@dataclass(frozen=True, slots=True)
class Web:
    url: str = ""
    rp_id: str = ""
    user: str = "airlock-web"
    enroll_minutes: float = 10.0
    listen: str = "127.0.0.1:8787"
    session_minutes: float = 15.0
    # Issue 49: a fleet console (a bastion): the hosts it reaches over SSH, and how it checks their relays.
    fleet_hosts: tuple[str, ...] = ()
    fleet_ssh_config: Path | None = None
    fleet_relay_secrets: Path | None = None
    fleet_name: str | None = None  # on a host: its name in the console's fleet_hosts (enrollment links name it)
    fleet_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()  # named groups of fleet_hosts (the page's filter)
    fleet_collector_journal: Path | None = None  # a collector's journal files, verified per host for the page
    fleet_host_keys: Path | None = None  # the hosts' checkpoint keys (`airlock audit verify --host-keys`)

    @property
    def origin(self) -> str:
        """The WebAuthn origin: ``scheme://host[:port]`` of ``url`` ("" when the web console is off)."""
        from urllib.parse import urlsplit

        if not self.url:
            return ""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def relying_party(self) -> str:
        """The WebAuthn RP ID: ``rp_id``, else the host of ``url``."""
        from urllib.parse import urlsplit

        return self.rp_id or (urlsplit(self.url).hostname or "" if self.url else "")


@dataclass(frozen=True, slots=True)
class Journal:
    operation_retention: float
    operation_capacity: int
    output_head_bytes: int
    anchor_every_records: int
    anchor_every_seconds: float
    checkpoint_key: Path = Path("/etc/airlock/checkpoint_ed25519_key")
    operation_capacity_per_agent: int = 256
    agent_bytes_per_second: int = 1024 * 1024
    agent_burst_bytes: int = 256 * 1024 * 1024
    # Segments and retention (issue 38; journal/segments.py).
    segment_max_bytes: int = 1024 * 1024 * 1024
    segment_max_age: float = 31 * 86400.0
    retention_max_age: float = 0.0
    retention_max_bytes: int = 0
    archive_dir: Path | None = None
    archive_max_age: float = 0.0
    archive_max_bytes: int = 0
    archive_delete_when: str = "never"
    disk_warn_percent: float = 10.0
    disk_warn_bytes: int = 1024 * 1024 * 1024
    disk_check_seconds: float = 60.0
    disk_warn_every_seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class Runner:
    containment: str
    slice: str
    memory_max: str | None
    tasks_max: int
    cpu_quota: str | None
    # Issue 35: each job's output kept by the runner (runner/outputlog.py).
    output_dir: Path = Path("/var/lib/airlock-runner/output")
    output_log_max_bytes: int = 8 * 1024 * 1024
    output_log_agent_bytes: int = 256 * 1024 * 1024  # issue 51: each requester's own-uid jobs
    output_log_root_bytes: int = 512 * 1024 * 1024  # issue 51: the root jobs each requester asked for
    output_log_total_bytes: int = 1024 * 1024 * 1024
    output_log_max_age_seconds: float = 30 * 86400.0
    exec_tree_max: int = 256
    exec_tree_source: str = "auto"


@dataclass(frozen=True, slots=True)
class Log:
    level: str
    target: str


@dataclass(frozen=True, slots=True)
class Notify:
    channels: tuple[Channel, ...]
    user: str
    state_dir: Path
    host: str | None
    poll_seconds: float
    digest_seconds: float
    remind_seconds: float
    rate_per_minute: int
    backoff_max_seconds: float
