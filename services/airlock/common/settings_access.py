"""The settings table, first part: where the sockets live, who may use each door, the services' accounts, the limits.

One `Setting` row per key (key, parser, default, help), in the order
docs/configuration.md shows them; `config.SETTINGS` is this part followed by
`settings_services.ROWS`.
"""

from __future__ import annotations

from pathlib import Path

from airlock.common.configvalues import (
    Observers,
    Setting,
    absolute_path,
    env_patterns,
    non_negative_float,
    non_negative_int,
    observers,
    parse_bool,
    positive_float,
    positive_int,
    string,
    string_list,
)

MiB = 1024 * 1024
# The approval window when operators are reached off the box (notify.channels) and
# approval.timeout_seconds is not set: 60 s fits a person at the console, not a phone.
RELAYED_APPROVAL_TIMEOUT = 600.0
RELAYED_WHY = "notify.channels is set and approval.timeout_seconds is not (set it to choose)"
# The most limits.max_total_output_bytes may be: base64 (4/3) of it and a 64-stage reply fit in common/ipc.py's 96 MiB.
MAX_TOTAL_OUTPUT = 48 * MiB


ROWS: tuple[Setting, ...] = (
    Setting("paths.runtime_dir", absolute_path, Path("/run/airlock"), "Where the sockets live."),
    Setting("paths.state_dir", absolute_path, Path("/var/lib/airlock"), "The journal's database lives here."),
    Setting(
        "paths.policy_dir",
        absolute_path,
        Path("/etc/airlock/policy.d"),
        "Extra policy files (*.yaml), read in name order.",
    ),
    Setting(
        "agents.users",
        string_list,
        (),
        "Users (names or uids) allowed on agent.sock; empty with no groups means anyone who can open it.",
    ),
    Setting("agents.groups", string_list, (), "Groups whose members are allowed on agent.sock."),
    Setting("agents.require_token", parse_bool, False, "Refuse agent requests that carry no valid session token."),
    Setting(
        "agents.retry_window_seconds",
        positive_float,
        600.0,
        "How long an agent's `sudo` retry (the same command after its tool gave up) joins the request it made"
        " before; a request whose agent left stays pending at most this long (issue 48).",
    ),
    Setting("operators.users", string_list, (), "Users (names or uids) allowed on operator.sock; root always is."),
    Setting("operators.groups", string_list, ("airlock-admin",), "Groups whose members are operators."),
    Setting(
        "operators.observers",
        observers,
        Observers(),
        "Read-only operators ({users: [...], groups: [...]}): status, pending, show and events only; every other "
        "operator verb answers unauthorized.",
    ),
    Setting(
        "operators.max_connections",
        positive_int,
        64,
        "Connections operator.sock handles at once (operators and observers together); more get 'busy'.",
    ),
    Setting(
        "operators.max_connections_per_user",
        non_negative_int,
        0,
        "Connections one user (peer uid, root included) may hold on operator.sock; more get 'busy' (0: a quarter "
        "of operators.max_connections, at least 1).",
    ),
    Setting("services.intake_user", string, "airlock-intake", "The user airlock-intake runs as."),
    Setting("services.approval_user", string, "airlock-approval", "The user airlock-approval runs as."),
    Setting("services.journal_user", string, "airlock-journal", "The user airlock-journal runs as."),
    Setting("services.runner_user", string, "root", "The user airlock-runner runs as."),
    Setting(
        "services.idle_exit_seconds",
        non_negative_float,
        300.0,
        "A socket-activated service exits after this long without work (0: never).",
    ),
    Setting(
        "services.stop_timeout_seconds", positive_float, 20.0, "On stop, how long in-flight work may take to finish."
    ),
    Setting("limits.max_request_bytes", positive_int, 1 * MiB, "Longest request line, newline included."),
    Setting("limits.max_connections", positive_int, 64, "Agent connections handled at once; more get 'busy'."),
    Setting(
        "limits.max_connections_per_agent",
        non_negative_int,
        0,
        "Connections one agent (peer uid) may hold at once; more get 'busy' (0: a quarter of "
        "limits.max_connections, at least 1).",
    ),
    Setting("limits.read_timeout_seconds", positive_float, 10.0, "Longest wait for the next bytes of a request."),
    Setting(
        "limits.write_timeout_seconds",
        positive_float,
        10.0,
        "A client that does not take its reply's bytes within this long is disconnected.",
    ),
    Setting("limits.request_timeout_seconds", positive_float, 30.0, "Longest time to receive a whole request."),
    Setting("limits.freshness_seconds", positive_float, 60.0, "Requests whose time is older than this are rejected."),
    Setting("limits.clock_skew_seconds", non_negative_float, 5.0, "How far in the future a request's time may be."),
    Setting(
        "limits.replay_window_seconds",
        positive_float,
        300.0,
        "How long a request ID is remembered (at least twice freshness_seconds).",
    ),
    Setting("limits.default_timeout_seconds", positive_float, 300.0, "A job's timeout when the request names none."),
    Setting("limits.max_output_bytes", positive_int, 16 * MiB, "Default and ceiling for captured bytes per stream."),
    Setting(
        "limits.max_total_output_bytes",
        positive_int,
        32 * MiB,
        "Captured bytes of one request across all stages and streams (stdout and every stage's stderr); "
        "past it the rest is read and dropped, and the streams that lost bytes are marked truncated "
        f"(at most {MAX_TOTAL_OUTPUT // MiB} MiB, so the reply always fits).",
    ),
    Setting("limits.kill_grace_seconds", non_negative_float, 1.0, "Between SIGTERM and SIGKILL of a job."),
    Setting(
        "limits.search_cpu_seconds",
        positive_int,
        5,
        "CPU seconds (RLIMIT_CPU) one files_search may use before it is stopped with limit_exceeded.",
    ),
    Setting(
        "env.allow",
        env_patterns,
        ("LANG", "TZ", "DEBIAN_FRONTEND", "TERM", "LC_*"),
        "Environment variables a request may set (a trailing * matches a prefix).",
    ),
)
