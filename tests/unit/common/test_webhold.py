"""common/webhold.py: which loopback addresses a console's web.url needs held (issue 46)."""

from __future__ import annotations

from airlock.common import webhold


def test_localhost_needs_both_loopback_addresses_at_the_urls_port() -> None:
    assert webhold.required("http://localhost:8787") == {("127.0.0.1", 8787), ("::1", 8787)}
    assert webhold.required("http://console.localhost:9000/") == {("127.0.0.1", 9000), ("::1", 9000)}
    assert webhold.required("http://127.0.0.1:8787") == {("127.0.0.1", 8787)}
    assert webhold.required("http://[::1]:8787") == {("::1", 8787)}


def test_a_real_name_or_no_url_needs_nothing_held_here() -> None:
    assert webhold.required("https://airlock.example.org") == frozenset()
    assert webhold.required("") == frozenset()


def test_only_127_0_0_1_leaves_ipv6_localhost_to_anyone() -> None:
    url = "http://localhost:8787"
    assert webhold.missing(url, [(("127.0.0.1", 8787), False)]) == [("::1", 8787)]
    assert webhold.missing(url, [(("127.0.0.1", 8787), False), (("::1", 8787), True)]) == []
    assert webhold.missing(url, [(("127.0.0.1", 8788), False), (("::1", 8787), True)]) == [("127.0.0.1", 8787)]


def test_wildcards_take_what_they_cover() -> None:
    url = "http://localhost:8787"
    assert webhold.missing(url, [(("::", 8787), False)]) == []  # dual-stack
    assert webhold.missing(url, [(("::", 8787), True)]) == [("127.0.0.1", 8787)]
    assert webhold.missing(url, [(("0.0.0.0", 8787), False)]) == [("::1", 8787)]  # noqa: S104
    assert webhold.shown(("::1", 8787)) == "[::1]:8787" and webhold.shown(("127.0.0.1", 1)) == "127.0.0.1:1"
