"""`airlock dev up`'s options, for the full CLI's parser (cli/main.py) and `dev up`'s short path (cli/quick.py).

A module of its own so that neither imports the other's (the short path skips
the full CLI's imports; the full CLI skips dev up's: yaml, the config table).
"""

from __future__ import annotations

import argparse


def dev_up_arguments(sp: argparse.ArgumentParser) -> None:
    """`airlock dev up`'s options: in the full CLI's parser (cli/main.py) and in its short path (`quick._dev_up`)."""
    sp.add_argument("--runtime-dir", default="./run", help="sockets, state and logs go here (default ./run)")
    sp.add_argument("--config", help="a config file whose keys override the built-in dev config")
    sp.add_argument(
        "--web",
        nargs="?",
        const="127.0.0.1:8787",
        metavar="HOST:PORT",
        help="also run airlock-web there (default 127.0.0.1:8787; port 0: any free port), at http://localhost:PORT",
    )
