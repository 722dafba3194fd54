"""Run directories: pre-flight check, lock, manifest, append-only records, compute entries
(`rundir`), and the shares of a sharded run (`shards`)."""
