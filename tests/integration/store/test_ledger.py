"""The event ledger on real PostgreSQL: each event id is stored once, however often and concurrently."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from gangline.store.ledger import LedgerEntry, record_event, record_events

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def _entry(**overrides: object) -> LedgerEntry:
    fields: dict[str, object] = {
        "event_id": f"evt-{uuid.uuid4()}",
        "type": "gangline.job.requested.v1",
        "source": "tests/ledger",
        "subject": "job-1",
        "time": T0,
        "data": {"job_id": "job-1", "queue": "research", "workers": 2, "gpus_per_worker": 8},
        "causation_id": None,
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "topic": "jobs.requests",
        "partition": 1,
        "offset": 42,
    }
    fields.update(overrides)
    return LedgerEntry(**fields)  # type: ignore[arg-type]


async def _count(pool: asyncpg.Pool, *event_ids: str) -> int:
    count = await pool.fetchval(
        "SELECT count(*) FROM events WHERE event_id = ANY($1::text[])", list(event_ids)
    )
    assert isinstance(count, int)
    return count


async def test_the_same_event_recorded_twice_is_stored_once(pg_pool: asyncpg.Pool) -> None:
    entry = _entry()
    async with pg_pool.acquire() as conn:
        assert await record_event(conn, entry) is True
        assert await record_event(conn, entry) is False
        # A redelivery from another offset is still the same event.
        assert await record_event(conn, _entry(event_id=entry.event_id, offset=43)) is False
        row = await conn.fetchrow("SELECT * FROM events WHERE event_id = $1", entry.event_id)
    assert await _count(pg_pool, entry.event_id) == 1
    assert row is not None
    assert row["data"] == entry.data
    assert row["time"] == T0
    assert (row["type"], row["source"], row["subject"]) == (entry.type, entry.source, entry.subject)
    assert (row["topic"], row["partition"], row["offset"]) == ("jobs.requests", 1, 42)
    assert row["traceparent"] == entry.traceparent
    assert row["causation_id"] is None
    assert row["recorded_at"] is not None


async def test_concurrent_inserts_of_one_event_store_it_once_and_exactly_one_caller_sees_it_new(
    pg_pool: asyncpg.Pool,
) -> None:
    entry = _entry()

    async def record() -> bool:
        async with pg_pool.acquire() as conn, conn.transaction():
            return await record_event(conn, entry)

    results = await asyncio.gather(*(record() for _ in range(16)))
    assert results.count(True) == 1
    assert await _count(pg_pool, entry.event_id) == 1


async def test_an_event_recorded_in_a_rolled_back_transaction_is_not_stored(pg_pool: asyncpg.Pool) -> None:
    entry = _entry()

    class Abort(Exception):
        pass

    async with pg_pool.acquire() as conn:
        with pytest.raises(Abort):
            async with conn.transaction():
                assert await record_event(conn, entry) is True
                raise Abort
        # The projection update failed with it, so the event must count as new again.
        assert await record_event(conn, entry) is True
    assert await _count(pg_pool, entry.event_id) == 1


async def test_a_batch_reports_the_new_ids_in_order_once_each(pg_pool: asyncpg.Pool) -> None:
    old, a, b, c = _entry(), _entry(), _entry(subject=None, data={}), _entry(causation_id="evt-cause")
    async with pg_pool.acquire() as conn:
        assert await record_event(conn, old)
        new = await record_events(conn, [a, old, b, a, c, b])
        assert await record_events(conn, [a, b, c]) == []
        assert await record_events(conn, []) == []
        rows = await conn.fetch(
            "SELECT event_id, subject, data, causation_id FROM events WHERE event_id = ANY($1::text[])",
            [b.event_id, c.event_id],
        )
    assert new == [a.event_id, b.event_id, c.event_id]
    assert await _count(pg_pool, old.event_id, a.event_id, b.event_id, c.event_id) == 4
    by_id = {r["event_id"]: r for r in rows}
    assert by_id[b.event_id]["subject"] is None
    assert by_id[b.event_id]["data"] == {}
    assert by_id[c.event_id]["causation_id"] == "evt-cause"


async def test_overlapping_concurrent_batches_store_each_event_once(pg_pool: asyncpg.Pool) -> None:
    entries = [_entry(offset=i) for i in range(40)]
    # Four writers, each with a different overlapping window of the same events, in a different order.
    windows = [entries[0:25], entries[10:40][::-1], entries[5:35], entries[::2]]

    async def write(window: list[LedgerEntry]) -> list[str]:
        async with pg_pool.acquire() as conn, conn.transaction():
            return await record_events(conn, window)

    results = await asyncio.gather(*(write(w) for w in windows))
    recorded = [event_id for result in results for event_id in result]
    assert sorted(recorded) == sorted(e.event_id for e in entries)
    assert await _count(pg_pool, *(e.event_id for e in entries)) == len(entries)
