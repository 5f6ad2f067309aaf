"""airlock-web's TCP listening sockets: bound so nobody else shares the address, checked against web.url.

`webhold` says which loopback addresses a ``web.url`` needs; this module binds
them (``airlock dev up``, airlock-web started by hand) and reads what a set of
listening sockets holds, so airlock-web can refuse to serve half an origin.
"""

from __future__ import annotations

import contextlib
import os
import socket

from airlock.common import webhold


def listen_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"{webhold.shown((host, port))}: {exc.strerror}") from None
    return sock


def bind_web(listen: str) -> list[socket.socket]:
    """airlock-web's listening sockets for dev up (``HOST:PORT``; port 0 picks a free one).

    dev up's web.url is ``http://localhost:PORT``: a loopback host is held on both
    127.0.0.1 and [::1] at one port (``webhold``), as airlock-web.socket does, or
    another local user could answer for localhost on the one left free.
    """
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    loopback = host in ("127.0.0.1", "::1", "localhost")
    for _attempt in range(20):  # port 0: the free IPv4 port may be taken on ::1; pick another
        first = listen_tcp(webhold.IPV4_LOOPBACK if host == "localhost" else host, int(port))
        if not loopback:
            first.listen(128)
            return [first]
        other = webhold.IPV6_LOOPBACK if first.family == socket.AF_INET else webhold.IPV4_LOOPBACK
        try:
            pair = [first, listen_tcp(other, first.getsockname()[1])]
        except OSError:
            first.close()
            if int(port) != 0:
                raise
            continue
        for sock in pair:
            sock.listen(128)
        return pair
    raise OSError(f"no port is free on both 127.0.0.1 and [::1] for {listen}")


def passed_sockets() -> list[socket.socket]:
    """The listening sockets systemd (or `airlock dev up`) handed over, if any (TCP or Unix)."""
    from systemd import daemon  # python3-systemd

    sockets = []
    for fd in daemon.listen_fds(unset_environment=True):
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(False)
        sockets.append(sock)
    return sockets


def bind(listen: str, url: str) -> list[socket.socket]:
    """``web.listen`` when started by hand: HOST:PORT, or a Unix socket path (0660, for a proxy in our group),
    and the loopback addresses ``url``'s origin needs that ``listen`` does not take."""
    also = webhold.missing(url, listen_address(listen))
    sockets = []
    try:
        if listen.startswith("/"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(listen)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(listen)
            os.chmod(listen, 0o660)
        else:
            [(address, _v6only)] = listen_address(listen)
            sockets.append(listen_tcp(*address))
        for address in also:
            sockets.append(listen_tcp(*address))
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    for sock in sockets:
        sock.listen(128)
    return sockets


def listen_address(listen: str) -> list[tuple[webhold.Address, bool]]:
    """What `bind` will hold for ``web.listen`` (nothing of TCP for a Unix socket path)."""
    if listen.startswith("/"):
        return []
    host, _, port = listen.rpartition(":")
    return [((host.strip("[]"), int(port)), True)]


def held(sockets: list[socket.socket]) -> list[tuple[webhold.Address, bool]]:
    """Each listening TCP socket's (address, port) and whether an IPv6 one takes IPv6 only."""
    out = []
    for sock in sockets:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            continue
        name = sock.getsockname()
        v6only = sock.family == socket.AF_INET6 and bool(sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
        out.append(((str(name[0]), int(name[1])), v6only))
    return out


def unheld(url: str, sockets: list[socket.socket]) -> str | None:
    """Why these sockets cannot be web.url's console (an address of its origin is left to others), or None."""
    gaps = webhold.missing(url, held(sockets))
    if not gaps:
        return None
    where = " and ".join(webhold.shown(a) for a in gaps)
    return (
        f"web.url {url} is whatever answers on every address its host resolves to, and airlock-web does not "
        f"hold {where}: any local user could listen there and be this console's origin. Listen there too "
        "(airlock-web.socket's ListenStream=), or use a TLS proxy on a real name (docs/operations.md)"
    )
