#!/bin/sh
# An example approval.notify_command for airlock: tell a human that a request waits.
#
#   approval:
#     notify_command: [/etc/airlock/notify-example.sh]
#     notify_timeout_seconds: 10
#
# airlock-approval runs it as its own user each time a request becomes pending,
# with the pending request as one line of JSON on stdin, a clean environment
# (PATH, LANG, AIRLOCK_REQUEST_ID, AIRLOCK_OPERATOR_SOCKET) and a deadline.
# Its output is logged; a failure is logged and never changes a decision.
# Every field comes from an agent: treat it as untrusted text (no eval, no
# unquoted expansion, no HTML).
#
# Installed, the hook runs inside airlock-approval's systemd sandbox: no
# network (RestrictAddressFamilies), a read-only system, no new privileges.
# The `logger` channel below works as shipped; mail or chat need a drop-in
# that opens exactly what they use (docs/security.md shows one).
set -u

request=$(head -c 1048576)
id=${AIRLOCK_REQUEST_ID:-unknown}
# The fields a reviewer wants first, without a JSON tool: python3 is there on Debian.
summary=$(printf '%s' "$request" | python3 -c '
import json, sys
r = json.load(sys.stdin)
argv = " | ".join(" ".join(s.get("argv", [])) for s in r.get("stages", []))
who = r.get("peer", {}).get("user", "?")
how = "as root" if r.get("privileged") else "as themselves"
why = r.get("reason") or "no reason given"
print("%s wants to run %r %s: %r" % (who, argv, how, why))
' 2>/dev/null || echo "a request is pending")

# 1. Always: the system log (journalctl -t airlock-notify).
logger -t airlock-notify -- "pending $id: $summary" || true
echo "notified: pending $id: $summary"

# The digest every approve line carries (issue 27): the line then decides this request and no
# other asked later under the same ID. Twelve hex digits, or nothing.
expect=$(printf '%s' "$request" | python3 -c '
import json, re, sys
e = json.load(sys.stdin).get("expect") or ""
print(e if re.fullmatch("[0-9a-f]{12}", e) else "")
' 2>/dev/null || true)
expect=${expect:+ --expect $expect}

# 2. Mail, when a mailer is installed (bsd-mailx or mailutils).
if command -v mail >/dev/null 2>&1; then
    printf '%s\n\nairlock show %s\nairlock approve %s%s   |   airlock deny %s%s\n' \
        "$summary" "$id" "$id" "$expect" "$id" "$expect" | mail -s "airlock: approval needed ($id)" root
fi

# 3. Chat: uncomment and set a webhook URL (curl must be installed).
# curl -fsS -m 5 -H 'Content-Type: application/json' \
#     --data "$(printf '%s' "$summary" | python3 -c 'import json,sys; print(json.dumps({"text": sys.stdin.read()}))')" \
#     https://chat.example.com/hooks/XXXX >/dev/null

exit 0
