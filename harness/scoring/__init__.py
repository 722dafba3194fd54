"""Making scorers: on-policy trajectories (`collect`) and training on them (`training`)."""
