"""The `airlock` command: operators' and agents' command-line client, and `airlock dev up`."""
