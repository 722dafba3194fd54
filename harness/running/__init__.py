"""One run from configuration to run directory (`runner`, `invocation`), merging the
shares of a sharded run (`merge`), named presets, and the allocator's settings."""
