"""airlock-web's settings: where it listens (a documented port, or a Unix socket) and its sessions."""

from __future__ import annotations

import pytest

from airlock.common import config


def test_the_defaults_listen_on_localhost_8787_with_15_minute_sessions() -> None:
    web = config.defaults().web
    assert web.listen == "127.0.0.1:8787" and web.session_minutes == 15.0


@pytest.mark.parametrize("value", ["127.0.0.1:9000", "[::1]:8787", "/run/airlock-web/web.sock"])
def test_listen_takes_host_port_or_a_unix_socket_path(value: str) -> None:
    parsed = config.parse_text(f"web: {{listen: '{value}'}}\n", "/x.yaml")
    assert parsed.web.listen == value


@pytest.mark.parametrize("value", ["8787", "localhost", "127.0.0.1:0x1f", "127.0.0.1:70000", "web.sock", ":8787"])
def test_a_listen_value_that_is_neither_is_refused_with_its_place(value: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.parse_text(f"web: {{listen: '{value}'}}\n", "/x.yaml")
    assert str(err.value).startswith("/x.yaml:1:") and "web.listen" in str(err.value)


def test_session_minutes_must_be_positive() -> None:
    with pytest.raises(config.ConfigError):
        config.parse_text("web: {session_minutes: 0}\n", "/x.yaml")
