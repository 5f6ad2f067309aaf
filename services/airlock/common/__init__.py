"""Shared core of the airlock services: codec, config, logging, activation, peers, IPC."""
