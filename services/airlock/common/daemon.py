"""The common ``main()`` of the four services: config, logging, sockets, serve."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from airlock.common import activation, log
from airlock.common.config import Config, ConfigError, load
from airlock.common.errors import AirlockError
from airlock.common.server import Service

# Which FileDescriptorName= each service must be handed.
DOORS: dict[str, tuple[str, ...]] = {
    "intake": ("agent",),
    "approval": ("approval", "operator"),
    "runner": ("runner",),
    "journal": ("journal",),
}

EX_CONFIG = 78  # sysexits.h: systemd shows it, and it marks the start as a failure
# airlock-notify says READY=1 once each channel has had the journal's answer through approval, or after this
# long anyway (relay/service.py); `airlock dev up` gives it that long once the services are up (cli/dev.py).
RELAY_READY_SECONDS = 60.0

Builder = Callable[[Config, Mapping[str, socket.socket]], Awaitable[Service]]


def service_main(name: str, build: Builder, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"airlock-{name}",
        description=f"The airlock {name} service. It is started by its systemd socket unit "
        "(or by `airlock dev up`) and serves the sockets it is handed.",
    )
    parser.add_argument("--config", default=None, help="configuration file (default: /etc/airlock/airlock.yaml)")
    ns = parser.parse_args(argv)
    try:
        config = load(Path(ns.config) if ns.config else None)
    except ConfigError as exc:
        print(f"airlock-{name}: {exc}", file=sys.stderr)
        return EX_CONFIG
    log.configure(name, level=config.log.level, target=config.log.target)
    logger = log.get()
    try:
        sockets = activation.take_sockets(DOORS[name])
    except activation.ActivationError as exc:
        logger.error(f"{name}.activation.failed", error=str(exc))
        print(f"airlock-{name}: {exc}", file=sys.stderr)
        return 1

    async def run() -> None:
        service = await build(config, sockets)
        await service.serve(sockets)

    try:
        asyncio.run(run())
    except (AirlockError, ConfigError) as exc:
        message = exc.message if isinstance(exc, AirlockError) else str(exc)
        logger.error(f"{name}.start.failed", error=message)
        print(f"airlock-{name}: {message}", file=sys.stderr)
        return EX_CONFIG if isinstance(exc, ConfigError) else 1
    return 0
