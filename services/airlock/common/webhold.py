"""Which loopback addresses airlock-web must hold so nobody else can be its origin (issue 46).

A browser's ``http://localhost:PORT`` is whatever answers on *any* address
the name ``localhost`` resolves to: Chromium tries ``[::1]:PORT`` first, then
``127.0.0.1:PORT``.  A console that holds only one of them leaves the other
to any local user, who then *is* the console's origin (its passkey sign-ins,
enrollment links and decisions all check out against that origin).  So with
a loopback ``web.url`` the console must listen on every address of the name,
at the URL's port, or refuse to start.  A URL on a real name (``https://``
behind a TLS proxy) needs nothing held here: a local user cannot be that
origin without its certificate.

Pure: no I/O (addresses as text, no sockets).
"""

from __future__ import annotations

from urllib.parse import urlsplit

IPV4_LOOPBACK = "127.0.0.1"
IPV6_LOOPBACK = "::1"

Address = tuple[str, int]  # (IP literal, port)


def _is_localhost(name: str) -> bool:
    # Browsers resolve localhost and every *.localhost name to loopback themselves (RFC 6761).
    return name == "localhost" or name.endswith(".localhost")


def required(url: str) -> frozenset[Address]:
    """The (address, port) pairs a console at ``url`` must hold; empty when nothing local can be its origin."""
    if not url:
        return frozenset()
    parts = urlsplit(url)
    name = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if _is_localhost(name):
        return frozenset({(IPV4_LOOPBACK, port), (IPV6_LOOPBACK, port)})
    if name.startswith("127.") or name == IPV6_LOOPBACK:
        return frozenset({(name, port)})
    return frozenset()


def covers(held: Address, v6only: bool, wanted: Address) -> bool:
    """Does a socket bound to ``held`` take connections for ``wanted``?  (Wildcards take every address.)"""
    host, port = held
    want_host, want_port = wanted
    if port != want_port:
        return False
    if host == want_host:
        return True
    wanted_v6 = ":" in want_host
    if host == "0.0.0.0":  # noqa: S104  (a wildcard that was bound, not one we bind)
        return not wanted_v6
    if host == "::":
        return wanted_v6 or not v6only
    return False


def missing(url: str, held: list[tuple[Address, bool]]) -> list[Address]:
    """What ``url`` needs that no listening socket in ``held`` ((address, v6only) pairs) takes, sorted."""
    return sorted(w for w in required(url) if not any(covers(h, v6only, w) for h, v6only in held))


def shown(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
