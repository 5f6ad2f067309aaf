"""`airlock gateway`: the sudo-proxy gateway's JSON-RPC on stdin/stdout, translated to the agent door."""
