"""airlock-runner: runs approved work (jobs and file operations) as the approved identity, contained, with evidence."""
