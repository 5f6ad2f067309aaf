"""airlock-web's pages escape every value (markup.html) and offer deciding only to operators."""

from __future__ import annotations

import time
from html.parser import HTMLParser
from typing import Any

from airlock.web import pages
from airlock.web.markup import Markup, escape, html, lines
from airlock.web.sessions import Session, Sessions

HOSTILE = "<script>alert(\"x\")</script>' onmouseover='boom' \"&amp;"


def session(role: str = "operator") -> Session:
    return Session("alice", role, "cred", "csrf-token", "proof-token", time.time(), time.time() + 60)


def pending_detail(argv: list[str]) -> dict[str, Any]:
    return {
        "request_id": HOSTILE,
        "operation_id": "op-1",
        "peer": {"user": HOSTILE, "uid": 1001, "pid": 42},
        "session": "",
        "reason": HOSTILE,
        "privileged": True,
        "run_as": {"uid": 0, "user": "root"},
        "env_names": [HOSTILE],
        "stages": [{"argv": argv, "binary": "/usr/bin/echo", "resolved": "/usr/bin/echo", "decision": "ask"}],
        "binaries": [],
        "sandbox": [],
        "arguments": [],
        "rule": HOSTILE,
        "request": {"spec": {"stages": [argv]}, "reason": HOSTILE},
        "policy": {"decision": "ask", "rule": "r"},
        "seconds_left": 100.0,
        "statement": f"airlock-approval v1\nrequest {HOSTILE}\n",
    }


def test_values_are_escaped_in_text_and_attributes() -> None:
    out = html('<a title="{t}">{t}</a>', t=HOSTILE)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert out.count('"') == 2  # only the template's own quotes: no value closes the attribute
    assert "'" not in out
    assert html("<p>{m}</p>", m=Markup("<b>kept</b>")) == "<p><b>kept</b></p>"
    assert escape("\x1b[31m\u202e") == escape("\x1b[31m\u202e").replace("\x1b", "")  # sanitised first


def test_a_request_page_escapes_argv_reason_user_and_statement() -> None:
    page = pages.request_view(
        {"pending": True, "detail": pending_detail(["echo", HOSTILE])}, session(), now=time.time()
    )
    full = pages.layout("Request", page, session(), "host")
    # The only tags are the template's: no value made a script, an attribute or an entity of its own.
    assert "<script>alert" not in full and "onmouseover='boom'" not in full
    assert full.count("<script") == 1 and 'src="/static/airlock-web.js"' in full
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in full
    assert "&amp;amp;" in full  # an entity in a value is shown as typed, never decoded
    tags = Tags()
    tags.feed(full)
    assert [t for t, _ in tags.seen if t == "script"] == ["script"]
    assert not [name for _, attrs in tags.seen for name, _ in attrs if name.startswith("on")]
    # The hostile text comes back whole as text and as the form's value: data, not markup.
    assert HOSTILE in tags.text and ("value", HOSTILE) in [a for _, attrs in tags.seen for a in attrs]


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.seen: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text += data


def test_observers_get_no_decide_form() -> None:
    detail = pending_detail(["true"])
    assert 'id="decide"' in pages.request_view({"pending": True, "detail": detail}, session("operator"))
    page = pages.request_view({"pending": True, "detail": detail}, session("observer"))
    assert 'id="decide"' not in page and "observer" in page


def test_the_grant_choice_follows_what_approval_accepts() -> None:
    detail = pending_detail(["true"])
    assert pages.grant_allowed(detail)
    assert not pages.grant_allowed(detail | {"arguments": [{"path": "/tmp/x"}]})
    assert not pages.grant_allowed(detail | {"quorum": {"needed": 2}})
    assert not pages.grant_allowed(detail | {"request": {"tool": "files_write", "path": "/etc/x"}})
    assert 'name="grant"' not in pages.decide_form(detail | {"quorum": {"needed": 2}}, session())


def test_sessions_expire_and_sign_out() -> None:
    store = Sessions(minutes=1)
    token, made = store.create("alice", "operator", "cred", now=1000.0)
    assert store.get(token, now=1059.0) == made
    assert store.get(token, now=1061.0) is None  # not sliding: a minute after sign-in it is over
    token, _ = store.create("alice", "operator", "cred", now=2000.0)
    store.drop(token)
    assert store.get(token, now=2001.0) is None
    assert store.get("x" * 500) is None
    assert made.csrf_ok(made.csrf) and not made.csrf_ok("") and not made.csrf_ok(None)


def test_preformatted_text_keeps_its_lines_and_escapes_each() -> None:
    shown = lines(f"a {HOSTILE}\n\x1b[2Jb\\")
    assert shown.split("\n")[0] == escape(f"a {HOSTILE}") and "<script>" not in shown
    assert shown.split("\n")[1] == "\\x1b[2Jb\\\\"  # a terminal escape is shown, never sent; \\ doubled once


def test_a_decision_carries_the_digest_of_the_statement_the_page_showed() -> None:
    """A touch signs only what was seen: the form posts the page's ``expect``, and the web passes it on
    to approval, which refuses with request_changed when another request is pending under that ID."""
    from airlock.web.door import decision_args

    page = pages.request_view(
        {"pending": True, "expect": "0123456789ab", "detail": pending_detail(["true"])}, session()
    )
    assert '<input type="hidden" name="expect" value="0123456789ab">' in page
    args = decision_args({"ref": "r1", "decision": "allow", "expect": "0123456789ab"})
    assert args == {"id": "r1", "decision": "allow", "expect": "0123456789ab"}
    assert "expect" not in decision_args({"ref": "r1", "decision": "allow"})


def test_a_phone_reads_the_command_run_as_and_decision_first_and_the_details_folded() -> None:
    """Issue 46: summary, then the buttons (restating command and run-as), then <details>; the ID small."""
    page = str(pages.request_view({"pending": True, "detail": pending_detail(["rm", "-rf", "/x"])}, session()))
    summary, decide, details = page.index('class="summary"'), page.index('id="decide"'), page.index("<details")
    assert summary < decide < details and page.index('class="rid"') < decide
    assert '<span class="badge root">runs as root (privileged)</span>' in page
    assert "run <code>rm -rf /x</code> as root (privileged)</button>" in page
    assert "<code>rm -rf /x</code> does not run</button>" in page
    listed = str(pages.pending_list([pending_detail(["rm", "-rf", "/x"])], now=1000.0))
    assert listed.index("<code>rm -rf /x</code>") < listed.index("badge root") < listed.index('class="rid"')
    assert 'data-until="1100"' in listed  # time left counts down in the page
