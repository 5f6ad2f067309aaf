"""The settings table, second part: what each service does (approval, journal, runner, log, notify, web).

One `Setting` row per key (key, parser, default, help); `config.SETTINGS` is
`settings_access.ROWS` followed by these.
"""

from __future__ import annotations

from pathlib import Path

from airlock.common import channels, containment
from airlock.common.configvalues import (
    WEB_PORT,
    Setting,
    SignerAccounts,
    absolute_path,
    choice,
    command,
    host_groups,
    label,
    non_negative_float,
    non_negative_int,
    optional_absolute_path,
    optional_string,
    parse_bool,
    positive_float,
    positive_int,
    signer_accounts,
    string,
    string_list,
    web_listen,
    web_url,
)
from airlock.common.settings_access import RELAYED_APPROVAL_TIMEOUT, MiB

ROWS: tuple[Setting, ...] = (
    Setting(
        "approval.timeout_seconds",
        positive_float,
        60.0,
        f"How long a request may wait for an operator; when unset and notify.channels is not empty, "
        f"{RELAYED_APPROVAL_TIMEOUT:g} (a phone notification, an SSH login or a signature round trip fits).",
    ),
    Setting("approval.allow_self_approval", parse_bool, False, "Whether an operator may approve their own request."),
    Setting("approval.ticket_ttl_seconds", positive_float, 10.0, "How long an approval ticket stays redeemable."),
    Setting(
        "approval.notify_command",
        command,
        (),
        "Run (argv, absolute path first) with each pending request as JSON on stdin.",
    ),
    Setting("approval.notify_timeout_seconds", positive_float, 10.0, "How long the notify command may run."),
    Setting(
        "approval.allowed_signers",
        absolute_path,
        Path("/etc/airlock/allowed_signers"),
        "An OpenSSH allowed_signers file: whose ssh-keygen signatures (namespace airlock-approval) approve or deny; "
        "absent: signed approvals are off. Must be readable by airlock-approval.",
    ),
    Setting(
        "approval.signer_accounts",
        signer_accounts,
        SignerAccounts(),
        "The operator account each allowed_signers principal is ({principal: user}): a signed vote is that "
        "person's vote. An unmapped principal counts only where no quorum and no self-approval check applies.",
    ),
    Setting(
        "approval.min_reason_length",
        non_negative_int,
        10,
        "Characters (after trimming) a reason must have where one is required (a rule's reason: required, "
        "approval.operator_reason).",
    ),
    Setting(
        "approval.operator_reason",
        choice("optional", "required"),
        "optional",
        "required: an operator approving privileged work must give a reason of approval.min_reason_length characters.",
    ),
    Setting(
        "approval.max_grant_seconds",
        positive_float,
        8 * 3600.0,
        "The longest time-boxed grant an operator may give (airlock approve --grant).",
    ),
    Setting(
        "approval.max_pending_per_agent",
        positive_int,
        10,
        "Requests one agent (peer uid) may have waiting for an operator at once; more are refused with rate_limited.",
    ),
    Setting(
        "approval.asks_per_minute",
        positive_int,
        20,
        "Requests one agent (peer uid) may put before operators in any 60 s; more are refused with rate_limited.",
    ),
    Setting(
        "approval.passkeys",
        absolute_path,
        Path("/etc/airlock/passkeys"),
        "The enrolled passkeys (one JSON object per line: credential ID, COSE public key, operator account, "
        "created, revoked), root's, written only by the runner for approval (airlock passkey); read by approval "
        "at every use, so an edit or a revocation applies at once. Absent: no passkey is enrolled.",
    ),
    Setting(
        "approval.state_dir",
        absolute_path,
        Path("/var/lib/airlock-approval"),
        "approval's own state (its unit's StateDirectory=): the passkeys' sign counters, kept across restarts.",
    ),
    Setting(
        "approval.reviewer_command",
        command,
        (),
        "The reviewer (argv, absolute path first): gets each request a person would be asked about as JSON on "
        'stdin and answers {"decision": "allow|deny|ask", "reason": "..."}; rules\' reviewer: says where '
        "its answer decides. Empty: no reviewer. Started by airlock-runner, sandboxed, as approval.reviewer_user.",
    ),
    Setting(
        "approval.reviewer_user",
        string,
        "airlock-reviewer",
        "The unprivileged user the reviewer runs as (never root; missing: the reviewer is off and people are asked).",
    ),
    Setting(
        "approval.reviewer_timeout_seconds",
        positive_float,
        10.0,
        "How long the reviewer may take; then it is killed and people are asked.",
    ),
    Setting(
        "approval.reviewer_name",
        label,
        "",
        "The reviewer's name in the journal and in messages (by: reviewer NAME); empty: its program's file name.",
    ),
    Setting(
        "approval.reviewer_network",
        parse_bool,
        False,
        "Whether the reviewer may use the network (a model-backed reviewer calling an API); off: no network at all.",
    ),
    Setting(
        "approval.denial_memory_seconds",
        positive_float,
        30 * 86400.0,
        "How long a person's denial is remembered by what would run (requester, run-as, binary, arguments; any "
        "spelling, cwd, environment or stdin): no grant and no reviewer allows the same thing in that time, "
        "people are asked. Read back from the journal at every start.",
    ),
    Setting("journal.operation_retention", positive_float, 300.0, "Seconds a completed operation can be replayed."),
    Setting(
        "journal.operation_capacity",
        positive_int,
        4096,
        "Completed operations kept for replay, all agents together; when full, a new operation of an agent with "
        "no outcome of its own to give up gets 'busy' (another agent's unexpired outcome is never evicted).",
    ),
    Setting(
        "journal.operation_capacity_per_agent",
        positive_int,
        256,
        "Completed operations kept for replay per agent (peer uid); past it the agent's own oldest goes.",
    ),
    Setting(
        "journal.agent_bytes_per_second",
        non_negative_int,
        1 * MiB,
        "Audit journal bytes one agent's (peer uid's) requests may write per second, sustained; a new request "
        "past the quota gets 'rate_limited' and nothing of it is written (0: no quota).",
    ),
    Setting(
        "journal.agent_burst_bytes",
        positive_int,
        256 * MiB,
        "Audit journal bytes one agent's requests may write in a burst above journal.agent_bytes_per_second.",
    ),
    Setting(
        "journal.output_head_bytes",
        non_negative_int,
        0,
        "Bytes of each output stream kept in the audit record (0: digest and size only).",
    ),
    Setting(
        "journal.anchor_every_records",
        non_negative_int,
        1000,
        "Anchor the chain head outside the database after this many records (0: only at start and stop).",
    ),
    Setting(
        "journal.anchor_every_seconds",
        non_negative_float,
        300.0,
        "Anchor the chain head at least this often while records are written (0: only at start and stop).",
    ),
    Setting(
        "journal.checkpoint_key",
        absolute_path,
        Path("/etc/airlock/checkpoint_ed25519_key"),
        "The host's checkpoint key (OpenSSH ed25519, made at install, readable only by airlock-journal): every "
        "anchor is signed with it (ssh-keygen -Y sign, namespace airlock-checkpoint); `airlock audit host-key` "
        "prints its public half. Absent: anchors go unsigned (logged).",
    ),
    Setting(
        "journal.segment_max_bytes",
        non_negative_int,
        1024 * MiB,
        "Seal the live audit segment and start a new one once its database reaches this size (0: never by size).",
    ),
    Setting(
        "journal.segment_max_age",
        non_negative_float,
        31 * 86400.0,
        "Seal the live audit segment once its first record is this many seconds old (0: never by age).",
    ),
    Setting(
        "journal.retention_max_age",
        non_negative_float,
        0.0,
        "Move a sealed segment to the archive folder once it was sealed this many seconds ago (0: never by age).",
    ),
    Setting(
        "journal.retention_max_bytes",
        non_negative_int,
        0,
        "Move the oldest sealed segments to the archive folder while the sealed segments beside the live one "
        "take more than this many bytes (0: no limit).",
    ),
    Setting(
        "journal.archive_dir",
        optional_absolute_path,
        None,
        "Where archived segments go (unset: journal-archive in the state folder).",
    ),
    Setting(
        "journal.archive_max_age",
        non_negative_float,
        0.0,
        "An archived segment sealed this many seconds ago may be deleted, if journal.archive_delete_when holds "
        "(0: never by age).",
    ),
    Setting(
        "journal.archive_max_bytes",
        non_negative_int,
        0,
        "While the archive holds more than this many bytes its oldest segments may be deleted, if "
        "journal.archive_delete_when holds (0: no limit).",
    ),
    Setting(
        "journal.archive_delete_when",
        choice("never", "shipped", "confirmed"),
        "never",
        "When an archived segment past its limit is deleted: never; shipped (the fleet collector's "
        "acknowledgement covers its last record); confirmed (an operator ran `airlock audit archive --confirm`). "
        "Each deletion is journaled with the segment's range and final hash.",
    ),
    Setting(
        "journal.disk_warn_percent",
        non_negative_float,
        10.0,
        "Warn (journald, airlock status) when the journal's filesystem has less than this percent free (0: never).",
    ),
    Setting(
        "journal.disk_warn_bytes",
        non_negative_int,
        1024 * 1024 * 1024,
        "Warn when the journal's filesystem has fewer than this many bytes free (0: never); either threshold warns.",
    ),
    Setting(
        "journal.disk_check_seconds",
        positive_float,
        60.0,
        "How often the journal looks at its filesystem's free space.",
    ),
    Setting(
        "journal.disk_warn_every_seconds",
        positive_float,
        3600.0,
        "While space stays low the warning is repeated at most this often.",
    ),
    Setting(
        "runner.containment",
        choice(*containment.SETTING),
        "auto",
        "service: each job stage a transient systemd unit outside the runner's sandbox (a scope, or a service when "
        "its rule's sandbox or credentials need one); scope: a transient scope around the runner's children; auto: "
        "service when systemd runs and the runner is root, else a process group.",
    ),
    Setting("runner.slice", string, "airlock-jobs.slice", "The slice jobs are placed in (their services or scopes)."),
    Setting("runner.memory_max", optional_string, None, "MemoryMax= of each job (its service or scope; e.g. 2G)."),
    Setting(
        "runner.tasks_max", non_negative_int, 0, "TasksMax= of each job (its service or scope; 0: systemd's default)."
    ),
    Setting("runner.cpu_quota", optional_string, None, "CPUQuota= of each job (its service or scope; e.g. 200%)."),
    Setting(
        "runner.output_dir",
        absolute_path,
        Path("/var/lib/airlock-runner/output"),
        "Where the runner keeps each job's output log (root only, gzip; `airlock show ID --output`).",
    ),
    Setting(
        "runner.output_log_max_bytes",
        non_negative_int,
        8 * MiB,
        "Output bytes (stdout and stderr, redacted) kept per job; past it the log is cut and says so (0: no logs).",
    ),
    Setting(
        "runner.output_log_agent_bytes",
        positive_int,
        256 * MiB,
        "Disk bytes the output logs of one requester's own-uid jobs may take; past it its oldest go, no one else's.",
    ),
    Setting(
        "runner.output_log_root_bytes",
        positive_int,
        512 * MiB,
        "Disk bytes the output logs of the root jobs one requester asked for may take; past it the oldest of those go.",
    ),
    Setting(
        "runner.output_log_total_bytes",
        positive_int,
        1024 * MiB,
        "Disk bytes all output logs may take together; past it the group taking the most loses its oldest first.",
    ),
    Setting(
        "runner.output_log_max_age_seconds",
        positive_float,
        30 * 86400.0,
        "Output logs older than this are pruned (30 days).",
    ),
    Setting(
        "runner.exec_tree_max",
        non_negative_int,
        256,
        "Programs a job executed recorded in its exec.finished (its exec tree; the rest are counted as more; "
        "0: no exec tree).",
    ),
    Setting(
        "runner.exec_tree_source",
        choice("auto", "connector", "fanotify"),
        "auto",
        "Where exec trees come from: the process-events connector, fanotify exec opens (service containment "
        "only), or auto: the connector, else fanotify (a container).",
    ),
    Setting("log.level", choice("debug", "info", "warning", "error"), "info", "The lowest level logged."),
    Setting(
        "log.target",
        choice("auto", "journal", "stderr"),
        "auto",
        "auto: journald when stderr is the journal, else JSON lines on stderr.",
    ),
    Setting(
        "notify.channels",
        channels.parse,
        (),
        "Where airlock-notify sends pending requests and their outcome: a list of "
        "{type: webhook|ntfy|slack|email, ...} (docs/configuration.md lists each type's keys).",
    ),
    Setting(
        "notify.user",
        string,
        "airlock-notify",
        "The user airlock-notify runs as (make it an operators.observers user, not an operator).",
    ),
    Setting(
        "notify.state_dir",
        absolute_path,
        Path("/var/lib/airlock-notify"),
        "airlock-notify keeps its delivery cursors and status.json (for airlock status) here.",
    ),
    Setting(
        "notify.host",
        optional_string,
        None,
        "The host name messages give (and the ssh line uses); null: this machine's name.",
    ),
    Setting("notify.poll_seconds", positive_float, 0.5, "How often airlock-notify reads the events feed."),
    Setting(
        "notify.digest_seconds",
        non_negative_float,
        0.0,
        "Pending requests that arrive within this long of each other go as one digest message (0: one message each).",
    ),
    Setting(
        "notify.remind_seconds",
        non_negative_float,
        0.0,
        "Send a reminder when a pending request has this long left (0: no reminders).",
    ),
    Setting(
        "notify.rate_per_minute",
        positive_int,
        30,
        "Messages one channel may send per minute; more wait (a channel's rate_per_minute overrides it).",
    ),
    Setting(
        "notify.backoff_max_seconds",
        positive_float,
        300.0,
        "The longest wait between retries of a failed delivery (it doubles from 1 s).",
    ),
    Setting(
        "web.url",
        web_url,
        "",
        "The public URL of airlock-web (https://host.example/); its scheme://host[:port] is the WebAuthn origin "
        "passkeys are checked against. Empty: the web console and passkeys are off.",
    ),
    Setting("web.rp_id", string, "", "The WebAuthn relying party ID; empty: the host of web.url."),
    Setting(
        "web.user",
        string,
        "airlock-web",
        "The user airlock-web runs as: admitted on operator.sock as an observer that may also carry passkey "
        "verbs (it decides nothing by itself).",
    ),
    Setting(
        "web.enroll_minutes",
        positive_float,
        10.0,
        "How long an enrollment link (airlock passkey enroll) stays valid.",
    ),
    Setting(
        "web.listen",
        web_listen,
        f"127.0.0.1:{WEB_PORT}",
        "Where airlock-web listens when started by hand: HOST:PORT or a Unix socket path for a reverse proxy; "
        "with a localhost web.url it also listens on every loopback address of that name (127.0.0.1 and [::1]) "
        "at the URL's port, or refuses to start (under systemd, airlock-web.socket's ListenStream= lines decide "
        "and must hold them all).",
    ),
    Setting(
        "web.session_minutes",
        positive_float,
        15.0,
        "How long an airlock-web sign-in lasts; then the passkey signs in again.",
    ),
    Setting(
        "web.fleet_hosts",
        string_list,
        (),
        "Fleet mode (a bastion, docs/fleet.md): the hosts ([USER@]HOST, as ssh takes them) whose pending requests "
        "this airlock-web lists and to which it carries passkey decisions over OpenSSH; each host verifies them "
        "itself. Empty: the single-host console.",
    ),
    Setting(
        "web.fleet_ssh_config",
        optional_absolute_path,
        None,
        "Fleet mode: the ssh_config(5) file for the hosts (aliases, the observer login, its key, known_hosts).",
    ),
    Setting(
        "web.fleet_relay_secrets",
        optional_absolute_path,
        None,
        "Fleet mode: a file of 'HOST SECRET' lines, each host's fleet relay channel secret; a post checked with "
        "its host's secret makes the console ask that host at once (otherwise every 10 s).",
    ),
    Setting(
        "web.fleet_name",
        optional_string,
        None,
        "On a host of a fleet console (docs/fleet.md): this host's name in the console's web.fleet_hosts; "
        "enrollment links then name it (WEB_URL/enroll/TOKEN?host=NAME), so the console carries the "
        "registration to this host alone. null: links name no host (the single-host console).",
    ),
    Setting(
        "web.fleet_groups",
        host_groups,
        (),
        "Fleet mode: named groups of hosts (a mapping of name to a list of hosts as web.fleet_hosts names them), "
        "offered as the page's host-group filter (?group=NAME); a name not in web.fleet_hosts is refused.",
    ),
    Setting(
        "web.fleet_collector_journal",
        optional_absolute_path,
        None,
        "Fleet mode: a collector's journal directory (what systemd-journal-remote writes, mounted or synced here); "
        "with web.fleet_host_keys the page shows each host's chain as `airlock audit verify --journal "
        "--host-keys` checks it (every 5 minutes).",
    ),
    Setting(
        "web.fleet_host_keys",
        optional_absolute_path,
        None,
        "Fleet mode: the hosts' checkpoint keys (one `airlock audit host-key` line per host), which prove each "
        "host's chain in web.fleet_collector_journal; without them the page does not verify the collector.",
    ),
)
