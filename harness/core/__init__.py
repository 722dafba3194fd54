"""The kernel: problems, rows and pools (`types`), keyed randomness (`keys`), errors, the
run directory's records typed once (`schema`), the ledger, and small file utilities."""
