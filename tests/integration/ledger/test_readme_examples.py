"""The README's three example queries of the ledger, read from the README itself, run on the ledger's
schema (every migration, a scratch database filled with accounting_world's day and a half): each runs,
gives the columns its output block shows, and the rows shown have that many cells."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from integration.ledger.accounting_world import fill, world
from integration.ledger.readme_examples import README, examples, render

from gangline.store.migrate import migrate

pytestmark = pytest.mark.postgres


@pytest.fixture
async def conn(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    name = f"t_readme_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        dsn = pg_dsn.rsplit("/", 1)[0] + f"/{name}"
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        try:
            async with pool.acquire() as c:
                await migrate(c)
            await fill(pool, world())
            async with pool.acquire() as c:
                yield c
        finally:
            await pool.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def test_the_readme_has_three_example_queries_each_with_its_output() -> None:
    found = examples()
    assert len(found) == 3
    views = ("queue_utilisation_daily", "queue_wait_percentiles_daily", "FROM jobs")
    for example, source in zip(found, views, strict=True):
        assert source in example.query
        assert example.rows, "an example's output shows rows"
        assert all(len(row) == len(example.columns) for row in example.rows)


async def test_the_readme_queries_run_on_the_ledger_schema_and_give_the_columns_shown(
    conn: asyncpg.Connection,
) -> None:
    for example in examples():
        statement = await conn.prepare(example.query)
        assert tuple(a.name for a in statement.get_attributes()) == example.columns
        assert await statement.fetch(), f"no rows on the accounting world: {example.query}"


def test_an_example_that_names_a_column_the_schema_lacks_is_caught(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    text = README.read_text(encoding="utf-8").replace("gpu_hours | gpus |", "gpu_hours | gpu_count |", 1)
    readme.write_text(text, encoding="utf-8")
    first = examples(readme)[0]
    assert "gpu_count" in first.columns and first.columns != examples()[0].columns


def test_render_lays_rows_out_as_the_readme_does() -> None:
    rows = [{"queue": "team-a", "jobs": 3, "p50_s": None}, {"queue": "b", "jobs": 12, "p50_s": 7}]
    assert render(["queue", "jobs", "p50_s"], rows).splitlines() == [
        "queue  | jobs | p50_s",
        "team-a |    3 |",
        "b      |   12 |     7",
    ]
