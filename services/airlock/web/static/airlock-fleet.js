// airlock-web in fleet mode (issue 49): one passkey touch for a group of hosts' requests.
// The console makes the group and its challenge (/fleet/decide/begin); the browser's passkey
// signs it; the console carries the assertion to each host (/fleet/decide), and each host
// verifies it itself.  No inline script: the Content-Security-Policy allows none.
//
// Sign-in, enrollment, the tab's proof and the page shell are airlock-web.js's (loaded after
// this file): it says "airlock:bound" once a page is in place, and this file binds its forms then.
"use strict";

(function () {
  // The session's CSRF token: the sign-out form's (the page carries it once).
  function csrf() {
    const field = document.querySelector("form.signout input[name=csrf]");
    return field ? field.value : "";
  }

  // A JSON POST with this tab's proof and the CSRF token; its JSON (never throws on a refusal).
  async function post(path, body) {
    const done = await window.airlock.send(path, body, csrf());
    return done.data;
  }

  function say(text, kind) {
    const el = document.getElementById("fleet-status");
    if (el) { el.textContent = text; el.className = "status " + (kind || ""); }
  }

  async function decide(form, submitter) {
    const body = { key: form.dataset.key, decision: submitter ? submitter.value : "allow", reason: form.elements.reason.value };
    if (form.dataset.host) body.hosts = [form.dataset.host];
    say("Waiting for your passkey…");
    const begun = await post("/fleet/decide/begin", body);
    if (!begun.ok) throw new Error(begun.error || "refused");
    const cred = await navigator.credentials.get({ publicKey: window.airlock.publicKeyOptions(begun.options) });
    const done = await post("/fleet/decide", {
      group: begun.group, members: begun.members, decision: begun.decision, reason: begun.reason,
      credential: window.airlock.credentialJSON(cred),
    });
    const hosts = done.hosts || {};
    const good = Object.keys(hosts).filter(function (h) { return hosts[h].ok; });
    const bad = Object.keys(hosts).filter(function (h) { return !hosts[h].ok; });
    if (!done.hosts) throw new Error(done.error || "refused");
    say("Recorded on " + good.length + " host(s)" + (bad.length ? "; refused on " + bad.join(", ") : "") + ".",
      bad.length ? "error" : "ok");
    setTimeout(function () { location.reload(); }, 1500);
  }

  // A person's kill, hold or release: each host makes its own action statement (/fleet/act/begin), one
  // touch signs the list of their digests, and each host checks its own is in it before it acts.
  async function act(form) {
    const body = { action: form.dataset.action, hosts: form.dataset.hosts.split(",") };
    if (form.dataset.ref) body.ref = form.dataset.ref;
    if (form.elements.reason && form.elements.reason.value) body.reason = form.elements.reason.value;
    const begun = await post("/fleet/act/begin", body);
    if (!begun.ok) throw new Error(begun.error || "refused");
    say("Touch your passkey to " + begun.action + " on " + begun.members.map(function (m) { return m.host; }).join(", ") + "…");
    const cred = await navigator.credentials.get({ publicKey: window.airlock.publicKeyOptions(begun.options) });
    const done = await post("/fleet/act", {
      members: begun.members.map(function (m) { return { host: m.host, challenge_id: m.challenge_id }; }),
      digests: begun.digests, credential: window.airlock.credentialJSON(cred),
    });
    if (!done.hosts) throw new Error(done.error || "refused");
    const hosts = done.hosts;
    const good = Object.keys(hosts).filter(function (h) { return hosts[h].ok; });
    const bad = Object.keys(hosts).filter(function (h) { return !hosts[h].ok; }).concat(Object.keys(begun.refused || {}));
    say(begun.action + " done on " + good.length + " host(s)" + (bad.length ? "; refused on " + bad.join(", ") : "") + ".",
      bad.length ? "error" : "ok");
    setTimeout(function () { location.reload(); }, 1500);
  }

  function bind() {
    for (const form of document.querySelectorAll("form.fleet-act")) {
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        act(form).catch(function (err) { say(String(err.message || err), "error"); });
      });
    }
    for (const form of document.querySelectorAll("form.fleet-decide")) {
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        decide(form, event.submitter).catch(function (err) { say(String(err.message || err), "error"); });
      });
    }
  }

  document.addEventListener("airlock:bound", bind);
})();
