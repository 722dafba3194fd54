"""Built-in selectors."""
