"""The processor's record of what each batch consumed, on the real broker: every output names its batch's
ranges in the order they were handled (its cause inside them), and the run's restore positions and start
ride on the first committed transaction with outputs only, even when that batch aborted once first."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest
from bus_kafka_helpers import REGISTRY, ping, pong_handler, produce_raw, read_all

from gangline.bus import BatchInfo, Processor, ProcessorSettings
from gangline.bus.admin import TopicSpec
from gangline.bus.positions import (
    BATCH_HEADER,
    INPUTS_HEADER,
    RESTORED_HEADER,
    RESUMED_HEADER,
    STARTED_HEADER,
    parse_batch,
    parse_positions,
)
from gangline.bus.processor import InputRecording
from gangline.events.codec import decode, encode

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]
STARTED = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


async def test_each_output_names_the_batch_it_was_decided_in(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = await topic_factory(partitions=2)
    sink = await topic_factory(partitions=1)
    for n in range(10):
        await produce_raw(
            kafka_bootstrap, source.name, [encode(ping(n, job=f"job-{n % 2}"))], key=f"job-{n % 2}".encode()
        )
    failures = iter([True])  # the first batch aborts once and is retried

    async def crash_once(batch: BatchInfo) -> None:
        if next(failures, False):
            raise ConnectionError("simulated crash between produce and commit")

    settings = ProcessorSettings(
        bootstrap_servers=kafka_bootstrap,
        service="pong",
        instance_id="pong-0",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        input_topics=(source.name,),
        max_batch_records=3,
        poll_timeout_ms=100,
        retry_backoff_s=0.05,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
    )
    restored = {("elsewhere.topic", 0): 7}
    processor = Processor(
        settings,
        pong_handler(sink.name),
        registry=REGISTRY,
        before_commit=crash_once,
        inputs=InputRecording("run-a", restored, STARTED),
    )
    task = asyncio.create_task(processor.run())
    try:
        await read_all(kafka_bootstrap, sink.name, at_least=10, timeout_s=30)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)

    inputs = await read_all(kafka_bootstrap, source.name, partitions_count=2)
    where = {decode(r.value or b"", REGISTRY).id: (r.topic, r.partition, r.offset) for r in inputs}
    outputs = await read_all(kafka_bootstrap, sink.name, at_least=10)
    assert processor.stats.batches_aborted == 1
    batches: list[str] = []
    announced: list[bool] = []
    for record in outputs:
        headers = {k: v.decode() for k, v in record.headers}
        ranges = parse_batch(headers[BATCH_HEADER])
        topic, partition, offset = where[str(decode(record.value or b"", REGISTRY).causationid)]
        assert any(t == topic and p == partition and first <= offset < end for t, p, first, end in ranges)
        positions = parse_positions(headers[INPUTS_HEADER])
        assert all(positions[(t, p)] == end for t, p, _, end in ranges)
        if not batches or batches[-1] != headers[BATCH_HEADER]:
            batches.append(headers[BATCH_HEADER])
            announced.append(RESTORED_HEADER in headers)
            if RESTORED_HEADER in headers:
                assert parse_positions(headers[RESTORED_HEADER]) == restored
                # A new consumer group: both partitions resumed from the beginning.
                assert parse_positions(headers[RESUMED_HEADER]) == {(source.name, 0): 0, (source.name, 1): 0}
                assert datetime.fromisoformat(headers[STARTED_HEADER]) == STARTED
    # Consecutive batches of a partition follow on from each other; the restore is told once.
    assert announced == [True] + [False] * (len(batches) - 1)
    ends: dict[tuple[str, int], int] = {}
    for text in batches:
        for t, p, first, end in parse_batch(text):
            assert first == ends.get((t, p), 0)
            ends[(t, p)] = end
    assert sum(ends.values()) == len(inputs) == 10 and len(ends) == 2
