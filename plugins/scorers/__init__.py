"""Built-in scorers: a process reward model (PRM) and an outcome reward model (ORM)."""
