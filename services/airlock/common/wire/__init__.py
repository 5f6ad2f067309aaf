"""The internal protocol, declared once: every verb a door serves, who may call it, what it carries.

`wire.verb` is the machinery (typed messages, declarations, the door table a
server builds from them, the stub a caller uses); one module per door holds
that door's declarations (`wire.journal`, `wire.runner`, `wire.approval`,
`wire.operator`, `wire.agent`) and `wire.registry` lists them all for the tests
and for docs/protocol.md's generated tables.  In the spirit of OpenSSH's
monitor.h: a reader finds every conversation between two processes here.

This package imports nothing above `common`; servers import `wire.verb.serve`
with their door's declarations, callers import the declarations and a `Stub`.
"""
