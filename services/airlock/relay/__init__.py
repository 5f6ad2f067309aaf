"""airlock-notify: the relay that reaches operators off the box.

A package of its own name (``airlock.relay``) because ``airlock.common.notify``
is systemd's sd_notify.  It follows the events feed on operator.sock as an
observer (read-only) and delivers messages to webhook, ntfy, Slack/Mattermost
and email channels, at least once, each channel with its own durable cursor.
"""
