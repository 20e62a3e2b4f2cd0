"""PostgreSQL store: the asyncpg pool, schema migrations, the event ledger and (later) projections."""
