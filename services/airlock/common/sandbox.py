"""A rule's ``sandbox:``: a small, validated subset of systemd unit settings.

Pure: policy validates a rule's sandbox with it when the policy is loaded,
approval binds the normalised value to the ticket (``bound["sandbox"]``, one
entry per stage), and the runner turns the redeemed value into the
properties of each stage's transient service (runner/units.py), validating
it again.  No sandbox means a full root job, as with sudo.

===================  ===========================  ================================
key                  value                        unit setting
===================  ===========================  ================================
read_only            true/false                   ProtectSystem=strict
read_write_paths     list of absolute paths       ReadWritePaths=
private_network      true/false                   PrivateNetwork=
private_tmp          true/false                   PrivateTmp=
no_new_privileges    true/false                   NoNewPrivileges=
capabilities         list of CAP_* names          CapabilityBoundingSet=
memory_max           size (512M) / N% / infinity  MemoryMax=
cpu_quota            percentage (50%)             CPUQuota=
tasks_max            positive integer             TasksMax=
===================  ===========================  ================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode

Property = tuple[str, str, Any]  # (name, D-Bus signature, value)

_UINT64_MAX = 2**64 - 1
_UINT32_MAX = 2**32 - 1
_SIZE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<suffix>[KMGTPE]?)", re.IGNORECASE)
_SUFFIXES = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}

# Capabilities by number (linux/capability.h).
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)
_FLAGS = {
    "no_new_privileges": "NoNewPrivileges",
    "private_network": "PrivateNetwork",
    "private_tmp": "PrivateTmp",
    "read_only": "ProtectSystem",
}
KEYS = (
    "capabilities",
    "cpu_quota",
    "memory_max",
    "no_new_privileges",
    "private_network",
    "private_tmp",
    "read_only",
    "read_write_paths",
    "tasks_max",
)
_MAX_PATHS = 64


def _invalid(setting: str, value: Any, why: str) -> AirlockError:
    return AirlockError(ErrorCode.INVALID_ARGUMENTS, f"{setting}: {why} (got {value!r})")


def memory_property(value: str, setting: str = "runner.memory_max") -> Property:
    """``MemoryMax`` as a D-Bus property: bytes (1024-based suffixes), ``N%`` or ``infinity``."""
    text = value.strip()
    if text == "infinity":
        return ("MemoryMax", "t", _UINT64_MAX)
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise _invalid(setting, value, "not a percentage") from None
        if not 0 < percent <= 100:
            raise _invalid(setting, value, "a percentage must be in (0, 100]")
        return ("MemoryMaxScale", "u", round(percent / 100 * _UINT32_MAX))
    match = _SIZE.fullmatch(text)
    if match is None:
        raise _invalid(setting, value, "expected bytes with an optional K, M, G, T, P or E suffix")
    size = int(float(match["number"]) * 1024 ** _SUFFIXES[match["suffix"].upper()])
    if not 0 < size < _UINT64_MAX:
        raise _invalid(setting, value, "out of range")
    return ("MemoryMax", "t", size)


def cpu_quota_property(value: str, setting: str = "runner.cpu_quota") -> Property:
    """``CPUQuota=200%`` as ``CPUQuotaPerSecUSec`` (microseconds of CPU per second)."""
    text = value.strip()
    try:
        percent = float(text[:-1]) if text.endswith("%") else float("nan")
    except ValueError:
        percent = float("nan")
    if not percent > 0:  # also rejects NaN
        raise _invalid(setting, value, "expected a positive percentage such as 200%")
    return ("CPUQuotaPerSecUSec", "t", round(percent * 10_000))


def _paths(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > _MAX_PATHS:
        raise _invalid(key, value, f"expected a list of 1 to {_MAX_PATHS} absolute paths")
    for path in value:
        if (
            not isinstance(path, str)
            or not path.startswith("/")
            or "\0" in path
            or any(c.isspace() for c in path)
            or any(part in (".", "..") for part in path.split("/"))
        ):
            raise _invalid(key, path, "expected an absolute path without '.', '..' or spaces")
    return list(value)


def properties(sandbox: Mapping[str, Any], where: str = "sandbox") -> list[Property]:
    """The unit properties of a sandbox; raises ``invalid_arguments`` naming the key."""
    if not isinstance(sandbox, Mapping):
        raise _invalid(where, sandbox, "expected a mapping of sandbox settings")
    props: list[Property] = []
    for key in sorted(sandbox):
        value = sandbox[key]
        setting = f"{where}.{key}"
        if key not in KEYS:
            raise AirlockError(ErrorCode.INVALID_ARGUMENTS, f"{setting}: unknown key (known: {', '.join(KEYS)})")
        if key in _FLAGS:
            if not isinstance(value, bool):
                raise _invalid(setting, value, "expected true or false")
            if key == "read_only":
                props.append(("ProtectSystem", "s", "strict" if value else "no"))
            else:
                props.append((_FLAGS[key], "b", value))
        elif key == "read_write_paths":
            props.append(("ReadWritePaths", "as", _paths(setting, value)))
        elif key == "memory_max":
            if not isinstance(value, str):
                raise _invalid(setting, value, "expected a size such as 512M")
            props.append(memory_property(value, setting))
        elif key == "cpu_quota":
            if not isinstance(value, str):
                raise _invalid(setting, value, "expected a percentage such as 50%")
            props.append(cpu_quota_property(value, setting))
        elif key == "tasks_max":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _invalid(setting, value, "expected a positive number")
            props.append(("TasksMax", "t", value))
        else:  # capabilities
            if not isinstance(value, list) or not all(isinstance(c, str) and c in CAPABILITIES for c in value):
                raise _invalid(setting, value, "expected a list of capability names such as CAP_NET_ADMIN")
            mask = 0
            for name in value:
                mask |= 1 << CAPABILITIES.index(name)
            props.append(("CapabilityBoundingSet", "t", mask))
    return props


def describe(sandbox: Mapping[str, Any] | None) -> str:
    """One line for an operator: what a sandbox confines, or the full-root default."""
    if not sandbox:
        return "none (a full job, as with sudo)"
    return "; ".join(f"{key}={sandbox[key]}" for key in sorted(sandbox))


def parse_bound(untrusted: Any, stages: int) -> tuple[Mapping[str, Any], ...] | None:
    """The redeemed ``bound["sandbox"]``: None (no rule had one) or one mapping per stage, each valid."""
    if untrusted is None:
        return None
    if not isinstance(untrusted, list) or len(untrusted) != stages:
        raise _invalid("bound.sandbox", untrusted, f"expected one sandbox per stage ({stages})")
    for index, item in enumerate(untrusted):
        properties(item, f"bound.sandbox[{index}]")
    return tuple(untrusted)
