"""Built-in search strategies."""
