"""The common ``main()`` of the four services: config, logging, sockets, serve."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from airlock.common import activation, lastgood, log
from airlock.common.config import DEFAULT_CONFIG_PATH, Config, ConfigError, defaults, load, parse_text
from airlock.common.errors import AirlockError
from airlock.common.server import Service

EX_CONFIG = 78  # sysexits.h: systemd shows it, and it marks the start as a failure

Builder = Callable[[Config, Mapping[str, socket.socket]], Awaitable[Service]]


KEPT_CONFIG = "airlock.yaml.last-good.json"


def load_or_keep(path: Path | None, state_dir: Path | None) -> Config:
    """The configuration on disk, kept in ``state_dir``; refused, the kept copy, else the defaults (issue 44).

    A service that exits on a typo in airlock.yaml fails its socket after systemd's start limit,
    and every client loses the gateway.  Under systemd (a StateDirectory) it starts instead on
    the last file it accepted, or on the built-in defaults, and says so (``Config.refused``, the
    log's ``<service>.config.refused``, approval's status).  Without one (`airlock dev up`, a
    test) a refused file is still an error.
    """
    target = path or DEFAULT_CONFIG_PATH
    text = None
    try:
        try:
            text = target.read_text(encoding="utf-8")  # read once: what is kept is what was parsed
        except FileNotFoundError:
            config = load(path)  # the defaults, or for a named file its error
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{target}: cannot read: {exc}") from None
        else:
            config = parse_text(text, str(target))
    except ConfigError as exc:
        if state_dir is None:
            raise
        refused = str(exc)
        kept = lastgood.read(state_dir, KEPT_CONFIG)
        if kept is not None:
            copy = f"{kept[1][0]['path']} (last accepted copy)"
            with contextlib.suppress(ConfigError):  # a copy from another version: the defaults then
                return dataclasses.replace(parse_text(str(kept[1][0]["text"]), copy), refused=refused)
        return dataclasses.replace(defaults(), source="<built-in defaults>", refused=refused)
    if state_dir is not None and text is not None:
        with contextlib.suppress(OSError):  # kept or not, the file was accepted
            lastgood.save(state_dir, KEPT_CONFIG, [{"path": config.source, "text": text}])
    return config


def service_main(name: str, build: Builder, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"airlock-{name}",
        description=f"The airlock {name} service. It is started by its systemd socket unit "
        "(or by `airlock dev up`) and serves the sockets it is handed.",
    )
    parser.add_argument("--config", default=None, help="configuration file (default: /etc/airlock/airlock.yaml)")
    ns = parser.parse_args(argv)
    # systemd's StateDirectory= (its first path): where the last accepted configuration is kept.
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    try:
        config = load_or_keep(Path(ns.config) if ns.config else None, Path(state) if state else None)
    except ConfigError as exc:
        print(f"airlock-{name}: {exc}", file=sys.stderr)
        return EX_CONFIG
    log.configure(name, level=config.log.level, target=config.log.target)
    logger = log.get()
    if config.refused:
        logger.error(f"{name}.config.refused", error=config.refused, running_on=config.source)
    try:
        sockets = activation.take_sockets(activation.DOORS[name])
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
