"""The ledger against the real broker and database: once per event id, nothing lost across a restart."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from gangline.bus import DLQ_CODE, DLQ_OFFSET, MAX_DEAD_LETTER_BYTES, Delivery, EventProducer, header
from gangline.bus.admin import delete_topics, ensure_topics
from gangline.bus.security import client_options
from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import decode, encode
from gangline.events.registry import Registry
from gangline.events.topics import topic_for
from services.common.topics import TopicNames
from services.ledger import wiring
from services.ledger.settings import LedgerSettings
from services.ledger.wiring import Ledger

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest_asyncio.fixture(loop_scope="session")
async def prefix(kafka_bootstrap: str) -> AsyncIterator[str]:
    """Every public topic (and DLQ twin) under a prefix of this test's own."""
    prefix = f"t-ledger-{uuid.uuid4().hex[:8]}."
    specs = TopicNames(prefix=prefix).specs()
    await ensure_topics(kafka_bootstrap, specs)
    try:
        yield prefix
    finally:
        await delete_topics(kafka_bootstrap, [s.name for s in specs])


def settings(bootstrap: str, prefix: str, pg_dsn: str) -> LedgerSettings:
    return LedgerSettings.from_env(
        {},
        kafka_bootstrap=bootstrap,
        topic_prefix=prefix,
        group_prefix=prefix + "g",
        pg_dsn=pg_dsn,
        max_batch_records=4,
        poll_timeout_ms=100,
    )


def envelope(data: Event, seconds: int) -> Envelope:
    return make_envelope(
        data, event_id=str(uuid.uuid4()), source="tests/ledger", time=T0 + timedelta(seconds=seconds)
    )


def job_history(job_id: str) -> list[Envelope]:
    spec = {"job_id": job_id, "queue": "default", "workers": 2, "gpus_per_worker": 1}
    placements = (
        allocations.Placement(rank=0, node="n0", gpus=("gpu0",)),
        allocations.Placement(rank=1, node="n1", gpus=("gpu0",)),
    )
    alloc = f"{job_id}-a1"
    events: list[Event] = [
        jobs.JobRequested.model_validate(spec),
        jobs.JobAdmitted(job_id=job_id, spec=jobs.JobRequested.model_validate(spec).spec()),
        jobs.JobPlaced(job_id=job_id, allocation_id=alloc, nodes=("n0", "n1")),
        allocations.AllocationGranted(
            job_id=job_id, allocation_id=alloc, queue="default", placements=placements
        ),
        jobs.JobStarted(job_id=job_id, allocation_id=alloc),
        jobs.JobCompleted(job_id=job_id, allocation_id=alloc),
        allocations.AllocationReleased(job_id=job_id, allocation_id=alloc, reason="completed"),
    ]
    return [envelope(e, i) for i, e in enumerate(events)]


async def publish(bootstrap: str, prefix: str, envelopes: Sequence[Envelope]) -> None:
    async with EventProducer(bootstrap) as producer:
        for env in envelopes:
            await producer.publish(prefix + topic_for(env.data), env)


async def count_events(pool: asyncpg.Pool, envelopes: Sequence[Envelope]) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM events WHERE event_id = ANY($1::text[])", [e.id for e in envelopes]
        )
    )


async def until(predicate: object, timeout_s: float = 30.0) -> None:
    """Poll an async predicate until it holds (a deadline guards the test, nothing is timed)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


async def run_ledger(ledger: Ledger) -> asyncio.Task[None]:
    task = asyncio.create_task(ledger.run())
    await asyncio.wait_for(ledger.started.wait(), 30)
    return task


async def stop(ledger: Ledger, task: asyncio.Task[None]) -> None:
    ledger.request_stop()
    await asyncio.wait_for(task, 30)


async def test_a_job_history_becomes_one_job_row_and_two_allocation_rows(
    kafka_bootstrap: str, prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    history = job_history(job_id)
    ledger = Ledger(settings(kafka_bootstrap, prefix, pg_dsn), pg_pool)
    task = await run_ledger(ledger)
    try:
        await publish(kafka_bootstrap, prefix, history)
        await until(lambda: _equals(count_events(pg_pool, history), len(history)))
        await until(lambda: _job_state(pg_pool, job_id, "completed"))
    finally:
        await stop(ledger, task)
    job = await pg_pool.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
    assert job is not None and (job["queue"], job["workers"], job["allocation_id"]) == (
        "default",
        2,
        f"{job_id}-a1",
    )
    rows = await pg_pool.fetch("SELECT * FROM allocations WHERE job_id = $1 ORDER BY rank", job_id)
    assert [(r["rank"], r["node"], r["gpus"], r["release_reason"]) for r in rows] == [
        (0, "n0", ["gpu0"], "completed"),
        (1, "n1", ["gpu0"], "completed"),
    ]
    stored = await pg_pool.fetchrow("SELECT topic, subject FROM events WHERE event_id = $1", history[0].id)
    assert (stored["topic"], stored["subject"]) == (prefix + "jobs.requests", job_id)


async def test_the_same_events_fed_twice_leave_one_row_each(
    kafka_bootstrap: str, prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    history = job_history(job_id)
    node = f"n-{uuid.uuid4().hex[:8]}"
    beat = envelope(nodes.NodeHeartbeat(node=node, seq=1), 1)
    ledger = Ledger(settings(kafka_bootstrap, prefix, pg_dsn), pg_pool)
    task = await run_ledger(ledger)
    try:
        await publish(kafka_bootstrap, prefix, [*history, beat])
        await publish(kafka_bootstrap, prefix, [*history, beat])  # a producer retrying everything
        await until(lambda: _seen(ledger, 2 * (len(history) + 1)))
    finally:
        await stop(ledger, task)
    assert await count_events(pg_pool, history) == len(history)
    assert await count_events(pg_pool, [beat]) == 0  # liveness, not history: only the node row moves
    assert ledger.stats.events_new == len(history)
    assert await pg_pool.fetchval("SELECT count(*) FROM jobs WHERE job_id = $1", job_id) == 1
    assert await pg_pool.fetchval("SELECT count(*) FROM allocations WHERE job_id = $1", job_id) == 2
    assert await pg_pool.fetchval("SELECT last_seq FROM nodes WHERE node = $1", node) == 1


def queue_status(queue: str, as_of: int, share: float) -> queues.QueueStatus:
    return queues.QueueStatus(
        queue=queue,
        cohort="lab",
        weight=1.0,
        dominant_share=share,
        dominant_resource="H100",
        position=1,
        of=2,
        resources={"H100": queues.QueueResource(used=4, nominal=8, borrowed=0, lendable=4)},
        as_of=T0 + timedelta(seconds=as_of),
    )


async def test_quotas_latest_queue_status_is_the_queues_row_whatever_order_and_repeats(
    kafka_bootstrap: str, prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    first, latest, stale = (
        envelope(queue_status(queue, 10, 0.1), 10),
        envelope(queue_status(queue, 20, 0.25), 20),
        envelope(queue_status(queue, 15, 0.9), 21),  # figures as of 15, read after those as of 20
    )
    sent = [first, latest, stale]
    ledger = Ledger(settings(kafka_bootstrap, prefix, pg_dsn), pg_pool)
    task = await run_ledger(ledger)
    try:
        await publish(kafka_bootstrap, prefix, sent)
        await publish(kafka_bootstrap, prefix, [first])  # redelivered: nothing moves back
        await until(lambda: _seen(ledger, 4))
    finally:
        await stop(ledger, task)
    assert await count_events(pg_pool, sent) == 3
    row = await pg_pool.fetchrow("SELECT * FROM queue_status WHERE queue = $1", queue)
    assert row is not None
    assert (row["dominant_share"], row["as_of"], row["event_id"]) == (
        0.25,
        T0 + timedelta(seconds=20),
        latest.id,
    )
    assert (row["position"], row["ranked_among"], row["cohort"], row["dominant_resource"]) == (
        1,
        2,
        "lab",
        "H100",
    )
    assert row["resources"] == {"H100": {"used": 4, "nominal": 8, "borrowed": 0, "lendable": 4}}
    stored = await pg_pool.fetchrow("SELECT topic, subject FROM events WHERE event_id = $1", latest.id)
    assert (stored["topic"], stored["subject"]) == (prefix + "queues.status", queue)


async def test_a_crash_between_the_database_commit_and_the_offset_commit_loses_and_duplicates_nothing(
    kafka_bootstrap: str, prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    job_ids = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    histories = [e for job_id in job_ids for e in job_history(job_id)]
    config = settings(kafka_bootstrap, prefix, pg_dsn)

    class Crash(Exception):
        pass

    async def crash_on_second_batch(batch: Sequence[Delivery]) -> None:
        if first.stats.batches == 2:
            raise Crash("killed after the database commit, before the offset commit")

    first = Ledger(config, pg_pool, after_db_commit=crash_on_second_batch)
    task = asyncio.create_task(first.run())
    await asyncio.wait_for(first.started.wait(), 30)
    await publish(kafka_bootstrap, prefix, histories)
    with pytest.raises(Crash):
        await asyncio.wait_for(task, 30)
    written_before_restart = await count_events(pg_pool, histories)
    assert 0 < written_before_restart < len(histories)

    second = Ledger(config, pg_pool)  # same consumer group: resumes from the committed offsets
    task = await run_ledger(second)
    more = job_history(f"job-{uuid.uuid4().hex[:8]}")
    try:
        await publish(kafka_bootstrap, prefix, more)
        await until(lambda: _equals(count_events(pg_pool, [*histories, *more]), len(histories) + len(more)))
        await until(lambda: _seen(second, len(histories) + len(more) - 4))
    finally:
        await stop(second, task)
    # The crashed batch was read again: seen twice, stored once.
    assert second.stats.events_seen > second.stats.events_new
    for job_id in job_ids:
        assert await pg_pool.fetchval("SELECT state FROM jobs WHERE job_id = $1", job_id) == "completed"


async def test_an_undecodable_record_goes_to_the_dead_letter_topic_and_the_ledger_carries_on(
    kafka_bootstrap: str, prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    history = job_history(job_id)[:1]
    ledger = Ledger(settings(kafka_bootstrap, prefix, pg_dsn), pg_pool)
    task = await run_ledger(ledger)
    try:
        async with EventProducer(kafka_bootstrap) as producer:
            await producer.raw.send_and_wait(prefix + "jobs.events", value=b"{not json", key=b"x")
        await publish(kafka_bootstrap, prefix, history)
        await until(lambda: _equals(count_events(pg_pool, history), 1))
    finally:
        await stop(ledger, task)
    dlq = AIOKafkaConsumer(
        prefix + "jobs.events.dlq",
        bootstrap_servers=kafka_bootstrap,
        **client_options(),
        auto_offset_reset="earliest",
    )
    await dlq.start()
    try:
        batch = await dlq.getmany(timeout_ms=10_000)
    finally:
        await dlq.stop()
    records = [r for rs in batch.values() for r in rs]
    assert [r.value for r in records] == [b"{not json"]
    assert dict(records[0].headers)["gangline-dlq-source-service"] == b"ledger"


async def _equals(value: object, expected: int) -> bool:
    return await value == expected  # type: ignore[misc]


async def _seen(ledger: Ledger, events: int) -> bool:
    return ledger.stats.events_seen >= events


async def _job_state(pool: asyncpg.Pool, job_id: str, state: str) -> bool:
    return await pool.fetchval("SELECT state FROM jobs WHERE job_id = $1", job_id) == state


async def test_an_event_the_database_keeps_refusing_is_dead_lettered_and_the_rest_are_stored(
    kafka_bootstrap: str, prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = job_history(f"job-{uuid.uuid4().hex[:8]}")
    poison = history[2]
    real_project_batch = wiring.project_batch

    async def refuse_the_poison(
        conn: asyncpg.Connection, deliveries: Sequence[Delivery], registry: Registry, **options: bool
    ) -> int:
        if any(d.envelope.id == poison.id for d in deliveries):
            raise asyncpg.DataError("value out of range")  # what a projection bug would look like
        return await real_project_batch(conn, deliveries, registry, **options)

    monkeypatch.setattr(wiring, "project_batch", refuse_the_poison)
    ledger = Ledger(settings(kafka_bootstrap, prefix, pg_dsn), pg_pool, retry_backoff_s=0.01)
    task = await run_ledger(ledger)
    try:
        await publish(kafka_bootstrap, prefix, history)
        await until(lambda: _equals(count_events(pg_pool, history), len(history) - 1))
        await until(lambda: _dead_lettered(ledger))
    finally:
        await stop(ledger, task)
    assert ledger.stats.retries >= 2 and ledger.stats.dead_lettered == 1
    dlq = AIOKafkaConsumer(
        prefix + topic_for(poison.data) + ".dlq",
        bootstrap_servers=kafka_bootstrap,
        **client_options(),
        auto_offset_reset="earliest",
    )
    await dlq.start()
    try:
        batch = await dlq.getmany(timeout_ms=10_000)
    finally:
        await dlq.stop()
    [record] = [r for rs in batch.values() for r in rs]
    assert decode(record.value).id == poison.id
    headers = dict(record.headers)
    assert headers["gangline-dlq-code"] == b"handler_failed"
    assert b"value out of range" in headers["gangline-dlq-reason"]


async def _dead_lettered(ledger: Ledger) -> bool:
    return ledger.stats.dead_lettered > 0


async def test_huge_deep_and_garbage_records_are_dead_lettered_once_each_within_the_limit(
    kafka_bootstrap: str, prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    history = job_history(job_id)
    big_subject = json.loads(encode(history[1]))
    big_subject["subject"] = "s" * 900_000
    bad = [
        bytes(range(256)) * 4090,  # 1 MiB of garbage, less the broker's framing
        json.dumps(big_subject).encode(),
        b"[" * 10_000 + b"]" * 10_000,
    ]
    refusals = iter(range(2))  # the first two writes of jobs.events are refused: read again
    real_project_batch = wiring.project_batch

    async def flaky(
        conn: asyncpg.Connection, deliveries: Sequence[Delivery], registry: Registry, **options: bool
    ) -> int:
        on_events = any(d.meta.topic == prefix + "jobs.events" for d in deliveries)
        if on_events and next(refusals, None) is not None:
            raise asyncpg.DataError("not now")
        return await real_project_batch(conn, deliveries, registry, **options)

    monkeypatch.setattr(wiring, "project_batch", flaky)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, **client_options(), max_request_size=2**21)
    await producer.start()
    try:
        # A small bad record among the job's events (in the batch that is refused and read again),
        # then the large ones; all on the job's partition of jobs.events.
        await publish(kafka_bootstrap, prefix, history[:2])
        await producer.send_and_wait(prefix + "jobs.events", value=b"\x00 garbage", key=job_id.encode())
        await publish(kafka_bootstrap, prefix, history[2:])
        for value in bad:
            await producer.send_and_wait(prefix + "jobs.events", value=value, key=job_id.encode())
    finally:
        await producer.stop()
    ledger = Ledger(settings(kafka_bootstrap, prefix, pg_dsn), pg_pool, retry_backoff_s=0.01)
    task = await run_ledger(ledger)
    dlq = AIOKafkaConsumer(
        prefix + "jobs.events.dlq",
        bootstrap_servers=kafka_bootstrap,
        **client_options(),
        auto_offset_reset="earliest",
    )
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        await until(lambda: _equals(count_events(pg_pool, history), len(history)))
        assert not task.done()  # never crashed
        # The large records come after the job's events: read the dead letters while the ledger still
        # runs (it may reach them after the last event is written), until the four are there (or 30 s
        # have passed, and fail); one large record per fetch.
        await dlq.start()
        deadline = asyncio.get_running_loop().time() + 30
        while len(records) < 4 and asyncio.get_running_loop().time() < deadline:
            batch = await dlq.getmany(timeout_ms=1_000)
            records += [r for rs in batch.values() for r in rs]
        batch = await dlq.getmany(timeout_ms=1_000)  # and no fifth one behind them
        records += [r for rs in batch.values() for r in rs]
    finally:
        await dlq.stop()
        await stop(ledger, task)
    offsets = [int(header(r.headers, DLQ_OFFSET) or b"-1") for r in records]
    assert len(offsets) == len(set(offsets)) == 4  # once each, though the first was read twice more
    for record in records:
        headers = sum(len(k) + len(v) for k, v in record.headers)
        assert len(record.value or b"") + len(record.key or b"") + headers <= MAX_DEAD_LETTER_BYTES
        assert header(record.headers, DLQ_CODE) in (b"malformed_message", b"schema_violation")
