// airlock-web in fleet mode (issue 49): one passkey touch for a group of hosts' requests.
// The console makes the group and its challenge (/fleet/decide/begin); the browser's passkey
// signs it; the console carries the assertion to each host (/fleet/decide), and each host
// verifies it itself.  No inline script: the Content-Security-Policy allows none.
"use strict";

(function () {
  function b64uToBuf(text) {
    const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
    const bin = atob(b64 + (b64.length % 4 ? "=".repeat(4 - (b64.length % 4)) : ""));
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out.buffer;
  }

  function bufToB64u(buf) {
    const bytes = new Uint8Array(buf);
    let bin = "";
    for (let i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]);
    return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function credentialJSON(cred) {
    const r = cred.response;
    return {
      id: cred.id, rawId: bufToB64u(cred.rawId), type: cred.type,
      response: {
        clientDataJSON: bufToB64u(r.clientDataJSON), authenticatorData: bufToB64u(r.authenticatorData),
        signature: bufToB64u(r.signature), userHandle: r.userHandle ? bufToB64u(r.userHandle) : null,
      },
    };
  }

  async function post(path, body) {
    const reply = await fetch(path, {
      method: "POST", credentials: "same-origin", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json", Accept: "application/json" },
    });
    let data = null;
    try { data = await reply.json(); } catch (e) { data = { ok: false, error: "HTTP " + reply.status }; }
    return data;
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
    const pk = Object.assign({}, begun.options, { challenge: b64uToBuf(begun.options.challenge) });
    const cred = await navigator.credentials.get({ publicKey: pk });
    const done = await post("/fleet/decide", {
      group: begun.group, members: begun.members, decision: begun.decision, reason: begun.reason,
      credential: credentialJSON(cred),
    });
    const hosts = done.hosts || {};
    const good = Object.keys(hosts).filter(function (h) { return hosts[h].ok; });
    const bad = Object.keys(hosts).filter(function (h) { return !hosts[h].ok; });
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
    const pk = Object.assign({}, begun.options, { challenge: b64uToBuf(begun.options.challenge) });
    const cred = await navigator.credentials.get({ publicKey: pk });
    const done = await post("/fleet/act", {
      members: begun.members.map(function (m) { return { host: m.host, challenge_id: m.challenge_id }; }),
      digests: begun.digests, credential: credentialJSON(cred),
    });
    const hosts = done.hosts || {};
    const good = Object.keys(hosts).filter(function (h) { return hosts[h].ok; });
    const bad = Object.keys(hosts).filter(function (h) { return !hosts[h].ok; }).concat(Object.keys(begun.refused || {}));
    say(begun.action + " done on " + good.length + " host(s)" + (bad.length ? "; refused on " + bad.join(", ") : "") + ".",
      bad.length ? "error" : "ok");
    setTimeout(function () { location.reload(); }, 1500);
  }

  // Sign-in: the challenge is a host's, and the host checks the answer (the console holds no key).
  async function signin() {
    const el = function (t, k) { const s = document.getElementById("signin-status"); s.textContent = t; s.className = "status " + (k || ""); };
    el("Waiting for your passkey…");
    const begun = await post("/signin/begin", {});
    if (!begun.ok) throw new Error(begun.error || "refused");
    const pk = Object.assign({}, begun.options, { challenge: b64uToBuf(begun.options.challenge) });
    if (Array.isArray(pk.allowCredentials)) {
      pk.allowCredentials = pk.allowCredentials.map(function (c) { return Object.assign({}, c, { id: b64uToBuf(c.id) }); });
    }
    const cred = await navigator.credentials.get({ publicKey: pk });
    const done = await post("/signin/finish", { challenge_id: begun.challenge_id, credential: credentialJSON(cred) });
    if (!done.ok) throw new Error(done.error || "refused");
    el("Signed in as " + done.account + ".", "ok");
    location.assign(done.next || "/");
  }

  function bind() {
    const form = document.getElementById("signin");
    if (form) {
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        signin().catch(function (err) {
          const s = document.getElementById("signin-status");
          s.textContent = String(err.message || err); s.className = "status error";
        });
      });
    }
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

  function ready() { bind(); document.documentElement.dataset.ready = "1"; }  // the forms are ours now
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready); else ready();
})();
