"""airlock-web: the operators' console in a browser, where a passkey signs each decision.

It is an observer on operator.sock (``web.user`` is in ``operators.observers``)
and a carrier of signed decisions: it renders pending requests, grants and
recent decisions, signs people in with a passkey (approval checks the
assertion and names the account), and forwards each decision's WebAuthn
assertion to approval, which verifies it against the enrolled credential.
Nothing it holds lets it decide by itself (docs/security.md).

Layered like the relay: it imports ``airlock.common`` only.
"""
