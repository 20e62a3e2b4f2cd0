"""Migration 0004 on the real PostgreSQL: the accounting columns the ledger writes, the utilisation and
wait views over them, and the backfill of rows projected before it. Each test has a scratch database."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from integration.ledger.accounting_world import NODES, T0, _registration, fill, world
from integration.ledger.readme_examples import examples

from gangline.events import allocations, jobs
from gangline.events.base import Envelope, make_envelope
from gangline.store.migrate import discover, migrate
from gangline.store.pool import create_pool

pytestmark = pytest.mark.postgres


@pytest.fixture
async def scratch(pg_dsn: str) -> AsyncIterator[str]:
    name = f"t_accounting_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield pg_dsn.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def pool(scratch: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(scratch, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            await migrate(conn)
        yield pool
    finally:
        await pool.close()


def _held(events: list[Envelope]) -> list[tuple[str, str, float, datetime, datetime]]:
    """(queue, model, GPUs, granted, released) of every allocation, read from the events themselves."""
    grants: dict[str, allocations.AllocationGranted] = {}
    times: dict[str, datetime] = {}
    out = []
    for e in events:
        if isinstance(e.data, allocations.AllocationGranted):
            grants[e.data.allocation_id], times[e.data.allocation_id] = e.data, e.time
        elif isinstance(e.data, allocations.AllocationReleased):
            g = grants[e.data.allocation_id]
            out.append((g.queue, g.gpu_type or "?", g.gpu_share, times[g.allocation_id], e.time))
    return out


def _by_day(held: list[tuple[str, str, float, datetime, datetime]]) -> dict[tuple[str, str, str], float]:
    """GPU-hours per (UTC day, queue, model), each allocation cut at midnight."""
    out: dict[tuple[str, str, str], float] = {}
    for queue, model, gpus, start, end in held:
        t = start
        while t < end:
            midnight = datetime(t.year, t.month, t.day, tzinfo=UTC) + timedelta(days=1)
            upto = min(end, midnight)
            key = (t.date().isoformat(), queue, model)
            out[key] = out.get(key, 0.0) + gpus * (upto - t).total_seconds() / 3600
            t = upto
    return out


def _percentile(values: list[float], q: float) -> float:
    """PostgreSQL's percentile_cont: linear between the two nearest ranks."""
    v = sorted(values)
    rank = q * (len(v) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


async def test_the_ledger_writes_gpu_seconds_model_final_state_and_times_per_job_and_allocation(
    pool: asyncpg.Pool,
) -> None:
    events = world()
    await fill(pool, events)
    per_job: dict[str, float] = {}
    rows = {r["job_id"]: r for r in await pool.fetch("SELECT * FROM jobs")}
    grants = {e.data.allocation_id: e for e in events if isinstance(e.data, allocations.AllocationGranted)}
    for e in events:
        if isinstance(e.data, allocations.AllocationReleased):
            g = grants[e.data.allocation_id]
            per_job[g.data.subject()] = (
                per_job.get(g.data.subject(), 0.0) + g.data.gpu_share * (e.time - g.time).total_seconds()
            )
    for job_id, seconds in per_job.items():
        assert rows[job_id]["gpu_seconds"] == pytest.approx(seconds)
        first = min(g.time for g in grants.values() if g.subject == job_id)
        assert rows[job_id]["granted_at"] == first
    finals = {e.subject: e.data for e in events if isinstance(e.data, jobs.JobCompleted | jobs.JobFailed)}
    for job_id, row in rows.items():
        if isinstance(finals.get(job_id), jobs.JobCompleted):
            assert row["final_state"] == "completed"
        elif isinstance(finals.get(job_id), jobs.JobFailed):
            assert row["final_state"] == "failed"
        elif row["state"] == "rejected":
            assert row["final_state"] == "rejected" and row["gpu_seconds"] == 0
    allocated = await pool.fetch("SELECT * FROM allocations")
    latest: dict[str, tuple[object, str]] = {}
    for a in sorted(allocated, key=lambda a: (a["granted_at"], -a["rank"])):
        latest[a["job_id"]] = (a["granted_at"], a["gpu_model"])
    for job_id, row in rows.items():
        # The model asked for, else (none asked) its latest allocation's, the node's: as migration 0004.
        expected = row["spec"].get("gpu_type") or (latest[job_id][1] if job_id in latest else None)
        assert row["gpu_model"] == expected, job_id
    assert all(a["queue"] in ("team-a", "team-b") for a in allocated)
    assert all(a["gpu_model"] == NODES[a["node"]][0] for a in allocated)
    total = sum(a["gpu_seconds"] for a in allocated)
    assert total == pytest.approx(sum(per_job.values()))


async def test_utilisation_per_queue_per_day_cuts_allocations_at_midnight(pool: asyncpg.Pool) -> None:
    events = world()
    await fill(pool, events)
    want = _by_day(_held(events))
    assert len({day for day, _, _ in want}) >= 2  # the world crosses midnight
    capacity: dict[str, int] = {}
    for model, count in NODES.values():
        capacity[model] = capacity.get(model, 0) + count
    rows = await pool.fetch("SELECT * FROM queue_utilisation_daily")
    got = {(r["day"].isoformat(), r["queue"], r["gpu_model"]): r for r in rows}
    assert set(got) == set(want)
    for key, hours in want.items():
        assert got[key]["gpu_hours"] == pytest.approx(hours)
        assert got[key]["gpus"] == capacity[key[2]]
        assert got[key]["utilisation"] == pytest.approx(hours / (capacity[key[2]] * 24))


async def test_wait_percentiles_per_queue_and_model_are_those_of_the_first_waits(pool: asyncpg.Pool) -> None:
    events = world()
    await fill(pool, events)
    admitted = {e.subject: e.time for e in events if isinstance(e.data, jobs.JobAdmitted)}
    first: dict[str, Envelope] = {}
    for e in events:
        if isinstance(e.data, allocations.AllocationGranted):
            first.setdefault(e.subject, e)
    waits: dict[tuple[str, str, str], list[float]] = {}
    for job_id, g in first.items():
        assert isinstance(g.data, allocations.AllocationGranted)
        key = (g.time.date().isoformat(), g.data.queue, g.data.gpu_type or "?")
        waits.setdefault(key, []).append((g.time - admitted[job_id]).total_seconds())
    rows = await pool.fetch("SELECT * FROM queue_wait_percentiles_daily")
    got = {(r["day"].isoformat(), r["queue"], r["gpu_model"]): r for r in rows}
    assert set(got) == set(waits)
    for key, values in waits.items():
        assert got[key]["jobs"] == len(values)
        for q, column in ((0.5, "p50_wait_s"), (0.9, "p90_wait_s"), (0.99, "p99_wait_s")):
            assert float(got[key][column]) == pytest.approx(_percentile(values, q))
    for example in examples():  # the README's examples run as written (test_readme_examples.py: more)
        assert await pool.fetch(example.query)


async def test_0004_backfills_rows_projected_before_it(scratch: str) -> None:
    conn = await asyncpg.connect(scratch)
    try:
        earlier = [m for m in discover() if m.version < 4]
        await migrate(conn, earlier)
        t0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
        await conn.execute(
            "INSERT INTO events (event_id, type, source, subject, time, data) VALUES "
            "('g1', 'gangline.allocation.granted.v1', 't', 'j1', $1, $2::text::jsonb)",
            t0,
            '{"job_id": "j1", "allocation_id": "a1", "queue": "team-a", "gpu_type": null, "placements": []}',
        )
        await conn.execute(
            "INSERT INTO nodes (node, state, gpu_count, gpu_model, updated_at, last_event_id) "
            "VALUES ('n0', 'ready', 8, 'H100', $1, 'r')",
            t0,
        )
        await conn.execute(
            "INSERT INTO allocations (allocation_id, job_id, rank, node, gpus, granted_at, granted_event_id, "
            "released_at, release_reason) VALUES ('a1', 'j1', 0, 'n0', '{g0,g1}', $1, 'g1', $2, 'completed')",
            t0,
            t0 + timedelta(hours=2),
        )
        await conn.execute(
            "INSERT INTO jobs (job_id, queue, state, workers, gpus_per_worker, spec, submitted_at, "
            "updated_at, last_event_id) VALUES ('j1', 'team-a', 'completed', 1, 2, '{}', $1, $1, 'x')",
            t0,
        )
        assert await migrate(conn, [m for m in discover() if m.version <= 4]) == [4]
        alloc = await conn.fetchrow("SELECT * FROM allocations")
        assert (alloc["queue"], alloc["gpu_model"], alloc["gpu_share"]) == ("team-a", "H100", 2)
        assert alloc["gpu_seconds"] == pytest.approx(2 * 2 * 3600)
        job = await conn.fetchrow("SELECT * FROM jobs")
        assert (job["final_state"], job["gpu_model"], job["granted_at"]) == ("completed", "H100", t0)
        assert job["gpu_seconds"] == pytest.approx(2 * 2 * 3600)
    finally:
        await conn.close()


async def test_a_job_that_names_no_gpu_model_takes_its_nodes(pool: asyncpg.Pool) -> None:
    # No gpu_type asked, an unlimited queue (quota charged no model), a grant that names none: the job's
    # model is its allocation's, the one its node registered (as migration 0004 filled in older rows).
    node = next(iter(NODES))
    model, count = NODES[node]
    spec = jobs.JobSpec(queue="default", workers=1, gpus_per_worker=count)
    placement = allocations.Placement(rank=0, node=node, gpus=tuple(f"gpu{g}" for g in range(count)))
    events = [
        _registration(node, model, count),
        jobs.JobRequested(job_id="any-1", **spec.model_dump()),
        jobs.JobAdmitted(job_id="any-1", spec=spec),
        jobs.JobQueued(job_id="any-1", queue="default"),
        allocations.AllocationGranted(
            job_id="any-1", allocation_id="any-1.a1", queue="default", placements=(placement,)
        ),
        jobs.JobStarted(job_id="any-1", allocation_id="any-1.a1"),
    ]
    envelopes = [
        make_envelope(e, event_id=f"any-{k}", source="tests/accounting", time=T0 + timedelta(seconds=k))
        for k, e in enumerate(events)
    ]
    await fill(pool, envelopes, batch=2)  # the grant and the start in one batch, the job's model from it
    job = await pool.fetchrow("SELECT gpu_model, state FROM jobs WHERE job_id = 'any-1'")
    assert (job["state"], job["gpu_model"]) == ("running", model)
    rows = await pool.fetch("SELECT gpu_model FROM job_waits WHERE job_id = 'any-1'")
    assert [r["gpu_model"] for r in rows] == [model]
