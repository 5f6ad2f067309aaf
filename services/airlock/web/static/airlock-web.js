// airlock-web: the passkey steps (WebAuthn) of enrollment, sign-in and decisions.
// Loaded from /static/ (the Content-Security-Policy allows no inline script).  The
// server relays each step to airlock-approval, which makes the options and verifies
// the results; this file only converts bytes (base64url) and calls the browser's API.
//
// A cookie alone is not a session (issue 46): the sign-in answer's proof is kept in this
// tab's sessionStorage (scoped to the origin, port included, unlike cookies) and sent as
// X-Airlock-Proof on every request.  A navigation cannot send a header, so a page first
// arrives as an empty shell ([data-airlock-load]); this script fetches it again with the
// proof and puts the answer in place.
"use strict";

(function () {
  function b64uToBuf(text) {
    const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
    const pad = b64.length % 4 ? "=".repeat(4 - (b64.length % 4)) : "";
    const bin = atob(b64 + pad);
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

  // Options as approval sends them (bytes base64url), as the browser's API wants them.
  function publicKeyOptions(options) {
    const pk = Object.assign({}, options && options.publicKey ? options.publicKey : options);
    if (typeof pk.challenge === "string") pk.challenge = b64uToBuf(pk.challenge);
    if (pk.user && typeof pk.user.id === "string") pk.user = Object.assign({}, pk.user, { id: b64uToBuf(pk.user.id) });
    for (const key of ["allowCredentials", "excludeCredentials"]) {
      if (Array.isArray(pk[key])) {
        pk[key] = pk[key].map(function (c) {
          return Object.assign({}, c, { id: typeof c.id === "string" ? b64uToBuf(c.id) : c.id });
        });
      }
    }
    return pk;
  }

  // A PublicKeyCredential as JSON, every byte string base64url.
  function credentialJSON(cred) {
    const r = cred.response;
    const response = { clientDataJSON: bufToB64u(r.clientDataJSON) };
    if (r.attestationObject) response.attestationObject = bufToB64u(r.attestationObject);
    if (r.authenticatorData) response.authenticatorData = bufToB64u(r.authenticatorData);
    if (r.signature) response.signature = bufToB64u(r.signature);
    if (r.userHandle) response.userHandle = bufToB64u(r.userHandle);
    if (typeof r.getTransports === "function") response.transports = r.getTransports();
    return { id: cred.id, rawId: bufToB64u(cred.rawId), type: cred.type, response: response };
  }

  const PROOF = "airlock-proof";

  function proof() {
    try { return sessionStorage.getItem(PROOF) || ""; } catch (e) { return ""; }
  }

  function keepProof(value) {
    try {
      if (value) sessionStorage.setItem(PROOF, value); else sessionStorage.removeItem(PROOF);
    } catch (e) { /* no storage: every page asks to sign in again */ }
  }

  // A JSON POST with this tab's proof (and the session's CSRF token): the reply's status and JSON.
  async function send(path, body, csrf) {
    const headers = { "Content-Type": "application/json", Accept: "application/json" };
    if (csrf) headers["X-Airlock-CSRF"] = csrf;
    if (proof()) headers["X-Airlock-Proof"] = proof();
    const reply = await fetch(path, {
      method: "POST", headers: headers, body: JSON.stringify(body), credentials: "same-origin",
    });
    let data = null;
    try { data = await reply.clone().json(); } catch (e) { data = { ok: false, error: await reply.text() }; }
    return { status: reply.status, data: data || { ok: false, error: "HTTP " + reply.status } };
  }

  async function post(path, body, csrf) {
    const done = await send(path, body, csrf);
    const data = done.data;
    if (done.status >= 400 || !data.ok) throw new Error(data.error || data.code || ("HTTP " + done.status));
    return data;
  }

  function say(id, text, kind) {
    const el = document.getElementById(id);
    if (el) { el.textContent = text; el.className = "status " + (kind || ""); }
  }

  function on(id, handler) {
    const form = document.getElementById(id);
    if (!form) return;
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      handler(form, event.submitter).catch(function (err) { say(id + "-status", String(err.message || err), "error"); });
    });
  }

  function bind() {
    on("enroll", async function (form) {
      const token = form.elements.token.value;
      // On a fleet console the link names the host the registration is carried to.
      const host = form.elements.host ? { host: form.elements.host.value } : {};
      say("enroll-status", "Waiting for your passkey…");
      const begun = await post("/enroll/begin", Object.assign({ token: token }, host));
      const cred = await navigator.credentials.create({ publicKey: publicKeyOptions(begun.options) });
      const done = await post("/enroll/finish", Object.assign({ token: token, credential: credentialJSON(cred) }, host));
      say("enroll-status", "Passkey enrolled for " + (done.account || "your account") + ". You can sign in now.", "ok");
    });

    on("signin", async function () {
      say("signin-status", "Waiting for your passkey…");
      // This tab's sign-in key: with the pre-session cookie, what the challenge is bound to.
      let tab = "";
      try {
        tab = sessionStorage.getItem("airlock-signin") || "";
        if (!tab) {
          const bytes = new Uint8Array(24);
          crypto.getRandomValues(bytes);
          tab = bufToB64u(bytes.buffer);
          sessionStorage.setItem("airlock-signin", tab);
        }
      } catch (e) { tab = ""; }
      const begun = await post("/signin/begin", { tab: tab });
      const cred = await navigator.credentials.get({ publicKey: publicKeyOptions(begun.options) });
      const done = await post("/signin/finish", {
        challenge_id: begun.challenge_id, credential: credentialJSON(cred), tab: tab,
      });
      keepProof(done.proof);
      say("signin-status", "Signed in as " + done.account + ".", "ok");
      window.location.assign(done.next || "/");
    });

    on("decide", async function (form, submitter) {
      const csrf = form.elements.csrf.value;
      const body = {
        ref: form.elements.ref.value,
        expect: form.elements.expect ? form.elements.expect.value : "",
        decision: submitter ? submitter.value : "allow",
        reason: form.elements.reason.value,
      };
      if (form.elements.grant && form.elements.grant.value) body.grant = form.elements.grant.value;
      for (const b of form.querySelectorAll("button")) b.disabled = true;
      try {
        say("decide-status", "Waiting for your passkey…");
        const begun = await post("/decide/begin", body, csrf);
        const cred = await navigator.credentials.get({ publicKey: publicKeyOptions(begun.options) });
        body.statement = begun.statement;
        body.credential = credentialJSON(cred);
        const done = await post("/decide", body, csrf);
        const r = done.result || {};
        let text;
        if (r.complete === false) {
          text = "Recorded: your approval counts (" + (r.progress || "") + "); it waits for another approver.";
        } else if ((r.decision || body.decision) === "deny") {
          text = "Recorded: denied. The agent reads your reason.";
        } else {
          text = "Recorded: approved. It runs now.";
        }
        say("decide-status", text, "ok");
      } finally {
        for (const b of form.querySelectorAll("button")) b.disabled = false;
      }
    });

    // Sign-out is a plain form POST: it carries the proof as a field.
    for (const form of document.querySelectorAll("form.signout")) {
      form.addEventListener("submit", function () {
        const field = document.createElement("input");
        field.type = "hidden"; field.name = "proof"; field.value = proof();
        form.appendChild(field);
        keepProof("");
      });
    }
  }

  // Time left, live: every [data-until] (Unix seconds) counts down.
  function tick() {
    const now = Date.now() / 1000;
    for (const el of document.querySelectorAll("[data-until]")) {
      const left = Math.max(0, Math.round(Number(el.dataset.until) - now));
      const m = Math.floor(left / 60), sec = left % 60;
      el.textContent = (left === 0 ? "expired" : (m ? m + "m" + String(sec).padStart(2, "0") + "s" : sec + "s") + " left");
    }
  }
  setInterval(tick, 1000);

  // The page's forms are bound: say so to the fleet console's script (static/airlock-fleet.js),
  // which binds its own then, and mark the page ready (a test waits for it).
  function bound() {
    bind();
    document.dispatchEvent(new Event("airlock:bound"));
    document.documentElement.dataset.ready = "1";
  }

  // What the fleet console's script uses of this one (one copy of the proof, the bytes, the POST).
  window.airlock = {
    send: send, post: post, proof: proof, b64uToBuf: b64uToBuf,
    publicKeyOptions: publicKeyOptions, credentialJSON: credentialJSON,
  };

  // The shell of a page: fetch it again with this tab's proof; without one, sign in.
  async function load() {
    if (!document.querySelector("[data-airlock-load]")) { bound(); return; }
    const reply = proof() ? await fetch(location.href, {
      headers: { "X-Airlock-Proof": proof() }, credentials: "same-origin", redirect: "follow",
    }) : null;
    if (!reply || reply.status === 401 || new URL(reply.url).pathname === "/signin") {
      keepProof("");
      location.assign("/signin");
      return;
    }
    const page = new DOMParser().parseFromString(await reply.text(), "text/html");
    document.title = page.title;
    document.body.replaceWith(document.adoptNode(page.body));
    bound();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", load); else load();
})();
