"""The plugin API: the hooks (`hookspecs`), the Protocols of the five kinds and their
capabilities (`interfaces`), and `Ops`, what a strategy calls."""
