"""airlock-web in fleet mode (issue 49): one page for every host's pending requests, one touch per group.

With ``web.fleet_hosts`` set, airlock-web serves this app instead of the
single-host console.  It holds no decision and no state of its own: the
rows are what the hosts said (`fleet.Fleet`, rebuilt at start and every
`REFRESH_SECONDS`, and at once for a host whose fleet relay channel posted
news, checked with that host's secret), and a decision is a passkey
assertion over a group that each host verifies itself.

Routes: ``GET /`` (the page, phone-first, the single-host console's
stylesheet), ``GET /fleet/rows`` (the rows as JSON), ``POST
/fleet/decide/begin`` (the group and the WebAuthn options of one touch),
``POST /fleet/decide`` (the assertion carried to each member host; each
host's answer), ``POST /fleet/act/begin`` and ``POST /fleet/act`` (a
person's kill, hold or release: each host's action statement, one touch over
their digests, carried back; each host verifies it and acts, docs/security.md),
``POST /fleet/relay`` (a host's relay post).  ``GET /`` and ``/fleet/rows``
take the filters ``group`` (``web.fleet_groups``), ``agent`` and ``rule``.  Every browser
POST must come from ``web.url``'s origin.

Sessions (`fleetsignin`: a passkey sign-in a host verifies) follow the
single-host console's rules (`tabs.Tabs`, issue 46), enforced here for every
route but the open ones (sign-in, enrollment, static files, relay posts): a
page (a GET outside ``/fleet/``) asked for with the cookie alone is an empty
shell whose script asks again with the tab's proof; data (a GET under
``/fleet/``) needs the cookie and the proof; every POST (the decisions and the
kill, hold and release steps too) needs both and the session's CSRF token.

Enrollment is served here too (`fleetenroll`: ``/enroll/TOKEN?host=NAME``,
carried to that host alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from importlib import resources
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from airlock.common import actions, groups
from airlock.common.channels.fleet import verify
from airlock.common.config import Config
from airlock.common.errors import AirlockError
from airlock.common.log import get as get_logger
from airlock.common.wire import passkey as pk
from airlock.web import fleetaudit, fleetpanel, fleetview, pages
from airlock.web.fleet import Fleet
from airlock.web.fleetenroll import Enrollment
from airlock.web.fleetsignin import SignIn
from airlock.web.markup import Markup, html, join
from airlock.web.sessions import Session
from airlock.web.tabs import body_of

REFRESH_SECONDS: Final = 10.0
OPEN: Final = frozenset(
    {"/signin", "/signin/begin", "/signin/finish", "/fleet/relay", "/enroll/begin", "/enroll/finish"}
)
STATIC: Final = {
    "airlock-web.css": "text/css",
    "airlock-web.js": "text/javascript",
    "airlock-fleet.js": "text/javascript",
}
MAX_BODY: Final = 1024 * 1024
TIMEOUT_MS: Final = 120_000
ALONE_FORMS: Final = 12  # "deny on HOST alone" forms for a row of at most this many hosts
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
log = get_logger("airlock.web.fleetweb")


def relay_secrets(path: Path | None) -> dict[str, str]:
    """``HOST SECRET`` lines (``#`` comments); none without a file."""
    if path is None:
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2 and not parts[0].startswith("#"):
            out[parts[0]] = parts[1]
    return out


def b64u(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def extras(reason: str) -> bytes:
    """The decision's extras as approval signs them (webauthn.extras: only what is given; no grant here)."""
    given = {"reason": reason} if reason else {}
    return json.dumps(given, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class FleetWeb:
    def __init__(self, config: Config, fleet: Fleet) -> None:
        self.config = config
        self.fleet = fleet
        self.secrets = relay_secrets(config.web.fleet_relay_secrets)
        self.signin = SignIn(config, fleet)
        self.enroll = Enrollment(fleet, _simple)
        self._tasks: set[asyncio.Task[None]] = set()

    @web.middleware
    async def guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if request.method == "POST" and request.path != "/fleet/relay":
                origin = request.headers.get("Origin", "")
                site = request.headers.get("Sec-Fetch-Site", "same-origin")
                if origin != self.config.web.origin or site != "same-origin":
                    return web.json_response({"ok": False, "error": "not from this console's origin"}, status=403)
            if not _open(request.path):
                request["session"] = await self.session_for(request)
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            response = exc
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    async def session_for(self, request: web.Request) -> Session:
        """The request's session by the single-host console's rules (module docstring), or an HTTP refusal."""
        tabs = self.signin.tabs
        if request.method in ("GET", "HEAD") and not request.path.startswith("/fleet/"):
            live = await self.signin.live(request, tabs.page(request, _simple("airlock fleet", pages.shell())))
            if live is None:
                raise web.HTTPSeeOther("/signin")
            return live
        body = await body_of(request) if request.method == "POST" else {}
        session = tabs.changing(request, body)
        session = await self.signin.live(request, session) if session is not None else None
        if session is None:
            raise web.HTTPUnauthorized(
                text=json.dumps({"ok": False, "error": "sign in first (a session: its cookie and this tab's proof)"}),
                content_type="application/json",
            )
        if request.method == "POST":
            tabs.check_csrf(request, body, session)
        return session

    def rows(self, filters: fleetview.Filters | None = None) -> list[fleetview.Row]:
        return fleetview.rows(self.fleet.views.values(), filters)

    def filters(self, request: web.Request) -> fleetview.Filters:
        """The page's filters from its query (a group the configuration does not name: 400)."""
        try:
            return fleetview.Filters.of(request.query, dict(self.config.web.fleet_groups))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None

    def panels(self, filters: fleetview.Filters) -> list[dict[str, Any]]:
        now = time.time()
        return [
            fleetview.panel(v, self.fleet.relays.get(v.host), self.fleet.collected.get(v.host), filters, now)
            for v in self.fleet.views.values()
            if filters.host(v.host)
        ]

    async def page(self, request: web.Request) -> web.StreamResponse:
        filters = self.filters(request)
        body = join(_row(r) for r in self.rows(filters)) or html("<li>No pending requests on these hosts.</li>")
        panels = self.panels(filters)
        status = join(fleetpanel.host(p, self.collector) for p in panels)
        who: Session = request["session"]
        role = "operator" if who.decides else "observer (read only)"
        text = html(
            PAGE,
            rows=body,
            hosts=status,
            count=len(self.fleet.hosts),
            account=who.account,
            role=role,
            csrf=who.csrf,
            filter=fleetpanel.filter_form(filters, [name for name, _ in self.config.web.fleet_groups]),
            every=fleetpanel.every_form([p["host"] for p in panels]),
        )
        return web.Response(text=_document("airlock fleet", text), content_type="text/html")

    @property
    def collector(self) -> bool:
        return bool(self.config.web.fleet_collector_journal and self.config.web.fleet_host_keys)

    async def rows_json(self, request: web.Request) -> web.StreamResponse:
        filters = self.filters(request)
        hosts = {p["host"]: p for p in self.panels(filters)}
        rows = [r.to_dict() for r in self.rows(filters)]
        return web.json_response({"ok": True, "rows": rows, "hosts": hosts, "filters": filters.query()})

    async def act_begin(self, request: web.Request) -> web.StreamResponse:
        """Each host's action statement for one touch: a kill on one host, a hold or release on one or many."""
        body = await self._body(request)
        hosts = body.get("hosts")
        if not isinstance(hosts, list) or not hosts or not all(h in self.fleet.views for h in hosts):
            return web.json_response({"ok": False, "error": "hosts: a list of this console's hosts"}, status=400)
        said = {k: body[k] for k in ("action", "ref", "signal", "reason") if body.get(k) not in (None, "")}
        try:
            args = pk.ActBegin.from_dict(said)
        except AirlockError as exc:
            return web.json_response({"ok": False, "error": exc.message}, status=400)
        if args.action == "kill" and len(hosts) != 1:
            return web.json_response({"ok": False, "error": "a kill is one job on one host"}, status=400)
        wanted = list(dict.fromkeys(str(h) for h in hosts))
        replies = await asyncio.gather(*(self.fleet.act_begin(h, args) for h in wanted))
        members, refused = [], {}
        for host, reply in zip(wanted, replies, strict=True):
            data = reply.get("data") or {}
            if reply.get("ok") and isinstance(data.get("digest"), str) and isinstance(data.get("statement"), str):
                members.append({"host": host, "challenge_id": data.get("challenge_id"), "statement": data["statement"]})
                members[-1]["digest"] = data["digest"]
            else:
                refused[host] = reply.get("error")
        if not members:
            return web.json_response(
                {"ok": False, "error": "no host made an action statement", "refused": refused}, status=409
            )
        digests = sorted({m["digest"] for m in members})
        options = {
            "challenge": b64u(actions.challenge(digests)),
            "rpId": self.config.web.relying_party,
            "timeout": TIMEOUT_MS,
            "userVerification": "required",
            "allowCredentials": [],
        }
        out = {"ok": True, "options": options, "action": args.action, "members": members, "digests": digests}
        return web.json_response(out | {"refused": refused})

    async def act(self, request: web.Request) -> web.StreamResponse:
        """The touch carried to each host, which checks it over its own statement and acts (each host's answer)."""
        body = await self._body(request)
        members, digests = body.get("members"), body.get("digests")
        if not isinstance(members, list) or not all(
            isinstance(m, dict) and m.get("host") in self.fleet.views for m in members
        ):
            return web.json_response({"ok": False, "error": "members: this console's hosts"}, status=400)
        try:
            carried = [
                (
                    str(m["host"]),
                    pk.Act.from_dict(
                        {
                            "challenge_id": m.get("challenge_id"),
                            "members": digests or [],
                            "credential": body.get("credential"),
                        }
                    ),
                )
                for m in members
            ]
        except AirlockError as exc:
            return web.json_response({"ok": False, "error": exc.message}, status=400)
        replies = await asyncio.gather(*(self.fleet.act(h, a) for h, a in carried))
        results = {
            h: {"ok": bool(r.get("ok")), "error": r.get("error")} for (h, _), r in zip(carried, replies, strict=True)
        }
        return web.json_response({"ok": bool(results) and all(r["ok"] for r in results.values()), "hosts": results})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return await body_of(request)

    async def decide_begin(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        decision, reason = body.get("decision"), str(body.get("reason") or "")
        hosts = body.get("hosts")
        row = fleetview.pick(self.rows(), str(body.get("key")), hosts if isinstance(hosts, list) else None)
        if decision not in ("allow", "deny") or row is None:
            return web.json_response({"ok": False, "error": "no such request pending (or a bad decision)"}, status=404)
        try:
            group, members = await self.fleet.begin(row, str(decision), extras(reason))
        except groups.GroupRefused as exc:
            return web.json_response({"ok": False, "error": exc.message}, status=409)
        options = {
            "challenge": b64u(groups.challenge(group, extras(reason))),
            "rpId": self.config.web.relying_party,
            "timeout": TIMEOUT_MS,
            "userVerification": "required",
            "allowCredentials": [],
        }
        out = {"group": group.to_dict(), "members": members, "decision": decision, "reason": reason}
        return web.json_response({"ok": True, "options": options} | out)

    async def decide(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        members = body.get("members")
        if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
            return web.json_response({"ok": False, "error": "members: a list"}, status=400)
        reason = str(body.get("reason") or "")
        carried = await self.fleet.carry(
            body.get("group") or {},
            members,
            str(body.get("decision")),
            body.get("credential"),
            **({"reason": reason} if reason else {}),
        )
        results = {h: {"ok": bool(r.get("ok")), "error": r.get("error")} for h, r in carried.items()}
        return web.json_response({"ok": all(r["ok"] for r in results.values()), "hosts": results})

    async def relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.content.read(MAX_BODY + 1)
        found = verify(body, request.headers.get("X-Airlock-Signature", ""), self.secrets)
        if found is None or len(body) > MAX_BODY:
            return web.Response(status=401, text="not signed by a host this console knows")
        host, message = found
        log.info("web.fleet.relay", host=host, seq=message.get("seq"), what=message.get("event"))
        if host in self.fleet.views:
            self.fleet.relayed(host, message, time.time())
        self._spawn(self.fleet.refresh([host]))  # the post is news; the host itself is the truth
        return web.Response(status=204)

    def _spawn(self, job: Any) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        data = resources.files("airlock.web").joinpath("static", name).read_bytes()
        kind = STATIC[name]
        etag = hashlib.sha256(data).hexdigest()[:16]
        return web.Response(body=data, content_type=kind, headers={"ETag": etag})

    async def refreshing(self) -> None:
        """Every host asked at start and every `REFRESH_SECONDS` (each call bounded in `Fleet.call`)."""
        while True:
            with contextlib.suppress(Exception):
                await self.fleet.refresh()
            await asyncio.sleep(REFRESH_SECONDS)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard], client_max_size=MAX_BODY)
        app.router.add_get("/", self.page)
        app.router.add_get("/fleet/rows", self.rows_json)
        app.router.add_post("/fleet/decide/begin", self.decide_begin)
        app.router.add_post("/fleet/decide", self.decide)
        app.router.add_post("/fleet/act/begin", self.act_begin)
        app.router.add_post("/fleet/act", self.act)
        app.router.add_post("/fleet/relay", self.relay)
        app.router.add_get("/static/{name}", self.static)
        app.router.add_get("/signin", self.signin_page)
        app.router.add_post("/signin/begin", self.signin_begin)
        app.router.add_post("/signin/finish", self.signin_finish)
        app.router.add_post("/signout", self.signout)
        app.router.add_get("/enroll/{token}", self.enroll.page)
        app.router.add_post("/enroll/begin", self.enroll.begin)
        app.router.add_post("/enroll/finish", self.enroll.finish)
        return app

    async def signin_page(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=_simple("airlock fleet: sign in", pages.signin_page()), content_type="text/html")

    async def signin_begin(self, request: web.Request) -> web.StreamResponse:
        return await self.signin.begin(request, await self._body(request))

    async def signin_finish(self, request: web.Request) -> web.StreamResponse:
        return await self.signin.finish(request, await self._body(request))

    async def signout(self, request: web.Request) -> web.StreamResponse:
        return self.signin.signout(request)


DOCUMENT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
<link rel="stylesheet" href="/static/airlock-web.css">
<script src="/static/airlock-fleet.js" defer></script>
<script src="/static/airlock-web.js" defer></script>
</head><body>{body}</body></html>
"""

SIMPLE = """<header><p class="brand">airlock fleet</p></header><main><h1>{title}</h1>{body}</main>"""

PAGE = """<header><p class="brand">airlock fleet: {count} hosts</p>
<nav><form class="signout" method="post" action="/signout"><input type="hidden" name="csrf" value="{csrf}">
<span class="who">{account}, {role}</span>
<button type="submit">Sign out</button></form></nav></header><main>
{filter}
<h1>Pending</h1>
<p id="fleet-status" class="status" role="status"></p>
<ul class="cards">{rows}</ul>
<h2>Hosts</h2>
{every}
<ul class="cards hosts">{hosts}</ul>
</main>
"""

ROW = """<li class="card fleet-row">
<p class="cmd"><code>{command}</code></p>
<p>runs as {run_as}; asked by {requester}</p>
<p class="io">in <code>{cwd}</code> · stdin {stdin}</p>
<p class="why">{reason}</p>
<p><strong>{n} host(s)</strong>: {hosts}</p>
<form class="decide fleet-decide" data-key="{key}">
<textarea name="reason" rows="2" maxlength="4096" placeholder="reason"></textarea>
<div class="buttons"><button class="allow" name="decision" value="allow">Approve on {n} host(s)</button>
<button class="deny" name="decision" value="deny">Deny on {n} host(s)</button></div>
</form>
{alone}
</li>
"""

ALONE = """<form class="decide fleet-decide" data-key="{key}" data-host="{host}">
<input type="hidden" name="reason" value="">
<button class="deny" name="decision" value="deny">Deny on {host} alone</button>
</form>
"""


def _open(path: str) -> bool:
    """Routes that need no session: sign-in, enrollment (its one-time token), static files, relay posts."""
    return path in OPEN or path.startswith(("/static/", "/enroll/"))


def _document(title: str, body: Markup) -> str:
    """A whole page: the fleet's script first (it listens for airlock-web.js's "airlock:bound"), then the
    console's own (sign-in, enrollment, the per-tab proof and the page shell)."""
    return str(html(DOCUMENT, title=title, body=body))


def _simple(title: str, body: Markup) -> str:
    """A page with a title and ``body`` (sign-in, enrollment, the shell, a refusal)."""
    return _document(title, html(SIMPLE, title=title, body=body))


def _row(row: fleetview.Row) -> Markup:
    shown = row.to_dict()
    # One host's request alone: a form per host, for a row of a few hosts (a wide row: /fleet/rows and hosts=[…]).
    few = 1 < len(row.hosts) <= ALONE_FORMS
    alone = join(html(ALONE, key=row.key, host=h) for h in row.hosts) if few else Markup("")
    return html(
        ROW,
        **{k: shown[k] for k in ("command", "run_as", "requester", "cwd", "stdin", "reason", "key")},
        n=len(row.hosts),
        hosts=", ".join(row.hosts),
        alone=alone,
    )


def app_for(config: Config) -> web.Application | None:
    """The fleet console's app when ``web.fleet_hosts`` is set (None: the single-host console): the hosts
    asked at start and every `REFRESH_SECONDS`, their SSH connections closed at the end."""
    if not config.web.fleet_hosts:
        return None
    ssh_config = str(config.web.fleet_ssh_config) if config.web.fleet_ssh_config else None
    console = FleetWeb(config, Fleet(config.web.fleet_hosts, ssh_config))
    app = console.app()

    async def start(_app: web.Application) -> None:
        console._spawn(console.refreshing())
        journal, keys = config.web.fleet_collector_journal, config.web.fleet_host_keys
        if journal is not None and keys is not None:
            console._spawn(fleetaudit.watching(journal, keys, list(console.fleet.hosts), console.fleet.collected))
        log.info("web.fleet.ready", hosts=len(console.fleet.hosts))

    async def stop(_app: web.Application) -> None:
        for task in list(console._tasks):
            task.cancel()
        await console.fleet.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app
