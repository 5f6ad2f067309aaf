"""airlock-intake: the agent door (native v1 and the sudo-proxy dialect), and each request's drive through the other
services."""
