"""Migrations on a scratch database of the real server: applied once, re-runs are no-ops, racers are safe."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gangline.store.migrate import Migration, MigrationError, discover, migrate, migrate_dsn

pytestmark = pytest.mark.postgres

PROJECTION_TABLES = {"events", "jobs", "allocations", "nodes", "schema_migrations"}


@pytest.fixture
async def scratch_dsn(pg_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty database on the test server, dropped afterwards."""
    name = f"t_migrate_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield pg_dsn.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def _tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return {r["tablename"] for r in rows}


async def test_a_fresh_database_gets_every_migration_and_a_rerun_is_a_no_op(scratch_dsn: str) -> None:
    versions = [m.version for m in discover()]
    assert await migrate_dsn(scratch_dsn) == versions
    assert await _tables(scratch_dsn) >= PROJECTION_TABLES

    assert await migrate_dsn(scratch_dsn) == []
    conn = await asyncpg.connect(scratch_dsn)
    try:
        recorded = await conn.fetch("SELECT version, checksum FROM schema_migrations ORDER BY version")
    finally:
        await conn.close()
    assert [(r["version"], r["checksum"]) for r in recorded] == [(m.version, m.checksum) for m in discover()]


async def test_services_migrating_at_once_apply_each_migration_once(scratch_dsn: str) -> None:
    results = await asyncio.gather(*(migrate_dsn(scratch_dsn) for _ in range(4)))
    applied = sorted(v for result in results for v in result)
    assert applied == [m.version for m in discover()]


async def test_a_migration_edited_after_it_was_applied_is_refused(scratch_dsn: str) -> None:
    conn = await asyncpg.connect(scratch_dsn)
    try:
        first = Migration(1, "first", "CREATE TABLE first_table (id int);")
        assert await migrate(conn, [first]) == [1]
        edited = Migration(1, "first", "CREATE TABLE first_table (id bigint);")
        with pytest.raises(MigrationError, match="changed after it was applied"):
            await migrate(conn, [edited])
        # The advisory lock was released: a correct run still proceeds.
        assert await migrate(conn, [first]) == []
    finally:
        await conn.close()


async def test_a_failing_migration_leaves_no_trace_and_keeps_the_ones_before_it(scratch_dsn: str) -> None:
    good = Migration(1, "good", "CREATE TABLE good_table (id int);")
    bad = Migration(2, "bad", "CREATE TABLE half_done (id int); SELECT 1 / 0;")
    conn = await asyncpg.connect(scratch_dsn)
    try:
        with pytest.raises(asyncpg.DivisionByZeroError):
            await migrate(conn, [good, bad])
        versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
    finally:
        await conn.close()
    assert versions == [1]
    tables = await _tables(scratch_dsn)
    assert "good_table" in tables
    assert "half_done" not in tables
