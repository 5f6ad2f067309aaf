"""airlock: a privileged-command gateway for AI agents and automation."""

__version__ = "0.1.0"
