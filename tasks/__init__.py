"""Built-in task plugins."""
