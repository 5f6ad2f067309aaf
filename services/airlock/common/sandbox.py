"""A rule's ``sandbox:``: a small, validated subset of systemd unit settings.

Policy validates a rule's sandbox with it when the policy is loaded,
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode

Property = tuple[str, str, Any]  # (name, D-Bus signature, value)
# The properties a transient scope takes as a service does (cgroup resource control): a stage whose
# sandbox has only these needs no service (issue 50: runner/forker.py); any other is service-only.
SCOPE_PROPERTIES = frozenset({"MemoryMax", "MemoryMaxScale", "CPUQuotaPerSecUSec", "TasksMax"})

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


# --- several rules' sandboxes as one (issue 27: most restrictive per key) -------------------


def merge(sandboxes: Iterable[Mapping[str, Any] | None], physical_memory: int | None = None) -> dict[str, Any] | None:
    """The sandboxes of every rule that decided a stage, combined: the most restrictive per key.

    None (a rule without ``sandbox:``) confines nothing and so adds nothing; all
    None is None (a full job).  Per key, with each value already valid:

    - ``read_only``, ``private_network``, ``private_tmp``, ``no_new_privileges``:
      true if any rule says true;
    - ``read_write_paths``: what every ``read_only`` rule leaves writable (the
      intersection; a rule that is not read-only leaves everything writable);
      none left under ``read_only`` means nothing stays writable;
    - ``capabilities``: only those every rule that lists capabilities keeps;
    - ``memory_max``, ``cpu_quota``, ``tasks_max``: the smallest (a percentage
      of memory is compared in bytes of ``physical_memory``, read from the
      system only when sizes and percentages meet).

    Independent of the order of ``sandboxes`` (tests check it).  Pure unless a
    percentage meets a size.
    """
    given = [dict(sb) for sb in sandboxes if sb is not None]
    if not given:
        return None
    out: dict[str, Any] = {}
    for flag in _FLAGS:
        values = [sb[flag] for sb in given if flag in sb]
        if values:
            out[flag] = any(values)
    writable = _writable(given)
    if writable is not None:
        out["read_write_paths"] = writable
    if not out.get("read_write_paths"):
        out.pop("read_write_paths", None)
    lists = [set(sb["capabilities"]) for sb in given if "capabilities" in sb]
    if lists:
        kept = set.intersection(*lists)
        out["capabilities"] = [c for c in CAPABILITIES if c in kept]
    tasks = [sb["tasks_max"] for sb in given if "tasks_max" in sb]
    if tasks:
        out["tasks_max"] = min(tasks)
    quotas = [sb["cpu_quota"] for sb in given if "cpu_quota" in sb]
    if quotas:
        out["cpu_quota"] = min(quotas, key=lambda q: (cpu_quota_property(q)[2], q))
    memories = [sb["memory_max"] for sb in given if "memory_max" in sb]
    if memories:
        out["memory_max"] = min(memories, key=lambda m: (_memory_bytes(m, memories, physical_memory), m))
    return {key: out[key] for key in sorted(out)}


def _norm(path: str) -> str:
    return "/" + "/".join(part for part in path.split("/") if part)


def _under(path: str, top: str) -> bool:
    return top == "/" or path == top or path.startswith(top + "/")


def _writable(given: list[dict[str, Any]]) -> list[str] | None:
    """``read_write_paths`` of the merge: the paths writable under every rule (None: no rule lists any)."""
    if not any("read_write_paths" in sb for sb in given):
        return None
    read_only = any(sb.get("read_only") for sb in given)
    # Under read_only a rule that is not read-only leaves everything writable; otherwise only the lists count.
    sets = [
        [_norm(p) for p in sb.get("read_write_paths") or []]
        for sb in given
        if (sb.get("read_only") if read_only else "read_write_paths" in sb)
    ]
    common: list[str] = sets[0] if sets else []
    for other in sets[1:]:
        common = [p for p in common if any(_under(p, q) for q in other)] + [
            q for q in other if any(_under(q, p) for p in common)
        ]
    kept = sorted(set(common))
    return [p for p in kept if not any(q != p and _under(p, q) for q in kept)]


def _memory_bytes(value: str, all_values: list[str], physical_memory: int | None) -> float:
    name, _sig, raw = memory_property(value)
    amount = float(raw)
    if name == "MemoryMax":
        return amount
    if all(memory_property(v)[0] == "MemoryMaxScale" for v in all_values):
        return amount  # all percentages: compared as they are
    total = physical_memory if physical_memory is not None else _physical_memory()
    return amount / _UINT32_MAX * total


def _physical_memory() -> int:
    import os

    return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))


def describe(sandbox: Mapping[str, Any] | None) -> str:
    """One line for an operator: what a sandbox confines, or the full-root default."""
    if not sandbox:
        return "none (a full job, as with sudo)"
    return "; ".join(f"{key}={sandbox[key]}" for key in sorted(sandbox))


@dataclass(frozen=True, slots=True)
class Sandbox:
    """One stage's sandbox as the runner holds it: its settings and their unit properties, computed once."""

    settings: Mapping[str, Any]  # as approval bound it (and exec.started journals it)
    properties: tuple[Property, ...]

    @classmethod
    def of(cls, settings: Any, where: str = "sandbox") -> Sandbox:
        """A valid sandbox, or ``invalid_arguments`` naming the key (`properties`)."""
        return cls(dict(settings) if isinstance(settings, Mapping) else settings, tuple(properties(settings, where)))

    def __bool__(self) -> bool:  # an empty sandbox is none: a full job
        return bool(self.settings)


def parse_bound(untrusted: Any, stages: int) -> tuple[Sandbox, ...] | None:
    """The redeemed ``bound["sandbox"]``: None (no rule had one) or one sandbox per stage, each valid."""
    if untrusted is None:
        return None
    if not isinstance(untrusted, list) or len(untrusted) != stages:
        raise _invalid("bound.sandbox", untrusted, f"expected one sandbox per stage ({stages})")
    return tuple(Sandbox.of(item, f"bound.sandbox[{index}]") for index, item in enumerate(untrusted))
