"""airlock-journal: the hash-chained SQLite audit journal, its anchors, and the replayable operation table."""
