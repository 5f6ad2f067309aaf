"""Notification channels: one class per type, found by the registry; a new type is one file."""

from __future__ import annotations

import http.server
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from airlock.common import channels
from airlock.common.channels.base import DeliveryError
from airlock.common.channels.ntfy import Ntfy
from airlock.common.config import ConfigError, parse_text

PIGEON = '''"""A test channel type."""
from typing import Any

from airlock.common.channels.base import REQUIRED, Channel, Key
from airlock.common.configvalues import optional_string, string


class Pigeon(Channel):
    kind = "pigeon"
    settings_keys = (Key("loft", string, REQUIRED), Key("ring", optional_string, None, secret=True))

    def send(self, message: dict[str, Any]) -> str:
        return "flown"


CHANNEL = Pigeon
'''


def test_the_registry_holds_each_module_of_the_package() -> None:
    package = Path(channels.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "base"}
    assert len(channels.CHANNELS) == len(modules)
    assert set(channels.CHANNELS) == {"email", "fleet", "ntfy", "slack", "webhook"}
    assert {cls.__module__.rsplit(".", 1)[1] for cls in channels.CHANNELS.values()} == modules


def test_a_new_channel_type_is_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pigeon.py").write_text(PIGEON)
    monkeypatch.setattr(channels, "__path__", [*channels.__path__, str(tmp_path)])
    try:
        monkeypatch.setattr(channels, "CHANNELS", channels._discover())
        entry = "{type: pigeon, loft: roof, ring: r-1}"
        cfg = parse_text(f"notify:\n  channels:\n    - {entry}\n", "/x.yaml")
        (settings,) = cfg.notify.channels
        assert settings == {
            "type": "pigeon",
            "name": "pigeon-0",
            "rate_per_minute": None,
            "loft": "roof",
            "ring": "r-1",
            "ring_file": None,
        }
        assert channels.of(settings).send({}) == "flown"
        # Its secret is masked by `config show` and may stand in a file, as the built-in types' do.
        assert cfg.to_dict()["notify"]["channels"][0]["ring"] == "[set]"
        with pytest.raises(ConfigError, match="a pigeon channel needs loft"):
            parse_text("notify:\n  channels:\n    - {type: pigeon}\n", "/x.yaml")
        with pytest.raises(ConfigError, match="give ring or ring_file, not both"):
            parse_text("notify:\n  channels:\n    - {type: pigeon, loft: a, ring: b, ring_file: /c}\n", "/x.yaml")
    finally:
        sys.modules.pop("airlock.common.channels.pigeon", None)
    # Without the file the type is unknown again.
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="must be one of email, fleet, ntfy, slack, webhook"):
        parse_text("notify:\n  channels:\n    - {type: pigeon, loft: roof}\n", "/x.yaml")


def test_a_secret_read_from_a_file_meets_the_rule_written_inline(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tk-from-file\n")
    cfg = parse_text(f"notify:\n  channels:\n    - {{type: ntfy, url: 'http://h/', token_file: {token}}}\n", "/x.yaml")
    channel = channels.of(cfg.notify.channels[0]).with_secrets()
    assert isinstance(channel, Ntfy)
    assert channel.settings["token"] == "tk-from-file"
    _, headers = channel.body({"event": "pending", "title": "t", "text": "x", "seq": 1})
    assert headers["Authorization"] == "Bearer tk-from-file"


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's status (and a Location for a redirect); keeps what it got."""

    def do_POST(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        server.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(server.status)
        if server.location:
            self.send_header("Location", server.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST  # a followed redirect may come back as a GET: it counts as reaching the server too

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def __init__(self, status: int, location: str = "") -> None:
        super().__init__(("127.0.0.1", 0), _Receiver)
        self.status, self.location, self.bodies = status, location, list[bytes]()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


def test_a_webhook_that_redirects_did_not_take_the_message_and_the_body_goes_nowhere_else() -> None:
    elsewhere, taken = _Server(200), _Server(200)
    redirecting = _Server(302, elsewhere.url)
    message = {"event": "pending", "title": "t", "text": "x", "seq": 1}
    try:
        hook = channels.of(parse_text(_webhook(redirecting.url), "/x.yaml").notify.channels[0])
        with pytest.raises(DeliveryError, match="HTTP 302"):
            hook.send(message)
        assert len(redirecting.bodies) == 1 and elsewhere.bodies == []
        # The control: a receiver that answers 200 takes the same message, signed.
        good = channels.of(parse_text(_webhook(taken.url), "/x.yaml").notify.channels[0])
        assert good.send(message) == "HTTP 200" and len(taken.bodies) == 1
    finally:
        for server in (elsewhere, taken, redirecting):
            server.shutdown()
            server.server_close()


def _webhook(url: str) -> str:
    return f"notify:\n  channels:\n    - {{type: webhook, url: '{url}', secret: 0123456789abcdef}}\n"


def test_a_logged_configuration_carries_no_secret() -> None:
    cfg = parse_text(_webhook("http://h/"), "/x.yaml")
    (hook,) = cfg.notify.channels
    assert hook["secret"] == "0123456789abcdef" and hook.name == "webhook-0"
    assert "0123456789abcdef" not in repr(cfg) and "'secret': '[set]'" in repr(hook)


def test_the_fleet_channel_signs_with_the_host_s_name_and_the_console_checks_it_with_that_host_s_secret() -> None:
    from airlock.common.channels import fleet, webhook

    console = _Server(200)
    message = {"event": "pending", "title": "t", "text": "x", "seq": 7, "request_id": "r1"}
    config = (
        f"notify:\n  channels:\n    - {{type: fleet, url: '{console.url}', host: web2, secret: 0123456789abcdef}}\n"
    )
    try:
        channel = channels.of(parse_text(config, "/x.yaml").notify.channels[0])
        assert channel.send(message) == "HTTP 200"
    finally:
        console.shutdown()
        console.server_close()
    (body,) = console.bodies
    signed = webhook.signature("0123456789abcdef", body)
    secrets = {"web1": "fedcba9876543210", "web2": "0123456789abcdef"}
    assert fleet.verify(body, signed, secrets) == ("web2", message | {"fleet_host": "web2"})
    # Another host's secret, an altered body, a host the console does not know: nothing.
    assert fleet.verify(body, webhook.signature(secrets["web1"], body), secrets) is None
    assert fleet.verify(body.replace(b'"r1"', b'"r2"'), signed, secrets) is None
    assert fleet.verify(body, signed, {"web1": secrets["web1"]}) is None
    with pytest.raises(ConfigError, match="a fleet channel needs secret or secret_file"):
        parse_text(f"notify:\n  channels:\n    - {{type: fleet, url: '{console.url}', host: web2}}\n", "/x.yaml")
