"""The asyncpg pool every service uses to reach PostgreSQL.

The DSN comes from the caller or `GANGLINE_PG_DSN`, defaulting to the cluster that
deploy/local/postgres.sh starts. jsonb columns read and write as Python objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import asyncpg

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:55432/gangline"
DSN_ENV = "GANGLINE_PG_DSN"


def dsn_from_env(environ: Mapping[str, str] | None = None) -> str:
    """`GANGLINE_PG_DSN` when set and not empty, else the local development cluster."""
    env = os.environ if environ is None else environ
    return env.get(DSN_ENV) or DEFAULT_DSN


async def init_connection(conn: asyncpg.Connection) -> None:
    """Per-connection setup: jsonb <-> Python objects. Also usable on a bare `asyncpg.connect`."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(
    dsn: str | None = None,
    *,
    min_size: int = 1,
    max_size: int = 10,
    **kwargs: Any,
) -> asyncpg.Pool:
    """An open pool on `dsn` (default: `dsn_from_env()`); close it with `await pool.close()`."""
    pool = await asyncpg.create_pool(
        dsn or dsn_from_env(),
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        **kwargs,
    )
    assert pool is not None  # asyncpg returns None only when awaited without a loop
    return pool
