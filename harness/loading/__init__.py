"""Plugin loading: the pluggy manager (`manager`), the typed registry of what plugins
registered (`registry`), and provenance (which plugin plays each part, its configuration)."""
