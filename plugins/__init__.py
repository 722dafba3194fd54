"""Built-in plugins: strategies, selectors (and, as they land, backbones and scorers)."""
