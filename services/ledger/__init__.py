"""The ledger: every public event into PostgreSQL, once, with the projections the API reads."""
