"""relay/reload.py: a reload takes web.url and names every other change as needing a restart (issue 44)."""

from __future__ import annotations

from airlock.common import config
from airlock.relay.reload import plan

CHANNEL = (
    "notify:\n  channels:\n    - {type: webhook, name: hook, url: 'http://127.0.0.1:9/x', secret: 0123456789abcdef0}\n"
)


def test_web_url_is_taken_and_everything_else_waits_for_a_restart() -> None:
    old = config.parse_text(CHANNEL + "web: {url: 'https://a.example.org'}\n", "/x.yaml")
    same = plan(old, config.parse_text(CHANNEL + "web: {url: 'https://b.example.org'}\n", "/x.yaml"))
    assert (same.web_url, same.needs_restart) == ("https://b.example.org", ())
    more = plan(old, config.parse_text(CHANNEL.replace("127.0.0.1:9", "127.0.0.1:10") + "log: {level: debug}\n", "/x"))
    assert more.web_url == "" and more.needs_restart == ("log.level", "notify.channels"), more
    assert plan(old, old).needs_restart == ()
