"""From records to numbers: statistics (`stats`), results.json (`results`), the
leaderboard, pooled estimators (`pooled`), diagnostics, a run read back (`evidence`), and
`dllmbench report` (`report`, `figures`)."""
