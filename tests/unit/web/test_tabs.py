"""web/tabs.py: the cookie both consoles set, and the half a cookie alone is (issue 46, issue 49's bastion)."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from airlock.web.tabs import Tabs, secure_origin


@pytest.mark.parametrize(
    ("url", "secure"),
    [
        ("https://fleet.example.com/", True),
        ("http://localhost:8787/", True),  # a secure context for browsers: Secure and __Host- are kept
        ("http://127.0.0.1:8787/", True),
        ("http://fleet.example.com/", False),  # plain HTTP on a name: a Secure cookie would be dropped
        ("", False),
    ],
)
def test_the_cookie_is_host_prefixed_wherever_the_browser_keeps_it(url: str, secure: bool) -> None:
    assert secure_origin(url) is secure
    assert Tabs(url, 15).cookie == ("__Host-airlock" if secure else "airlock")
    assert Tabs(url, 15, name="airlock-fleet").pre_cookie == ("__Host-" if secure else "") + "airlock-fleet-pre"


def test_a_cookie_alone_is_half_a_session_and_a_page_asked_with_it_is_the_shell() -> None:
    tabs = Tabs("https://fleet.example.com/", 15, name="airlock-fleet")
    token, session = tabs.sessions.create("alice", "operator", "cred", "ticket")
    cookie = {"Cookie": f"__Host-airlock-fleet={token}"}

    def request(headers: dict[str, str]) -> web.Request:
        return make_mocked_request("GET", "/", headers=headers)

    assert tabs.half(request(cookie)) == session
    assert tabs.whole(request(cookie)) is None
    assert tabs.whole(request(cookie | {"X-Airlock-Proof": "wrong"})) is None
    assert tabs.whole(request(cookie | {"X-Airlock-Proof": session.proof})) == session
    with pytest.raises(web.HTTPOk) as shell:
        tabs.page(request(cookie), "<p>the shell</p>")
    assert shell.value.text == "<p>the shell</p>"
    with pytest.raises(web.HTTPUnauthorized):
        tabs.page(request(cookie | {"X-Airlock-Proof": "wrong"}), "")
    with pytest.raises(web.HTTPSeeOther):
        tabs.page(request({}), "")
    assert tabs.page(request(cookie | {"X-Airlock-Proof": session.proof}), "") == session
    with pytest.raises(web.HTTPForbidden):
        tabs.check_csrf(request(cookie), {"csrf": "wrong"}, session)
    tabs.check_csrf(request(cookie), {"csrf": session.csrf}, session)
