"""Batches that publish nothing hold their offsets back; a publishing batch or the idle timer commits them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from bus_kafka_helpers import REGISTRY, Ping, pong_handler, produce_pings

from gangline.bus import Outgoing, Processor, ProcessorSettings, RecordMeta
from gangline.bus.admin import TopicSpec
from gangline.events.base import Envelope

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]


def _settings(bootstrap: str, topic: str, group: str, idle_commit_ms: int) -> ProcessorSettings:
    return ProcessorSettings(
        bootstrap_servers=bootstrap,
        service="idle",
        instance_id="idle-0",
        group_id=group,
        input_topics=(topic,),
        max_batch_records=5,
        poll_timeout_ms=50,
        idle_commit_ms=idle_commit_ms,
    )


async def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        committed: int | None = await consumer.committed(TopicPartition(topic, 0))
        return committed
    finally:
        await consumer.stop()


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


async def test_idle_offsets_ride_with_the_next_output_or_commit_on_the_timer(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = (await topic_factory(partitions=1)).name
    sink = (await topic_factory(partitions=1)).name
    group = f"g-{uuid.uuid4().hex[:8]}"
    pong = pong_handler(sink)
    handled: list[int] = []

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        assert isinstance(envelope.data, Ping)
        handled.append(envelope.data.n)
        return pong(envelope, meta) if envelope.data.n >= 100 else []  # below 100: fold, publish nothing

    processor = Processor(
        _settings(kafka_bootstrap, source, group, idle_commit_ms=60_000), handle, registry=REGISTRY
    )
    task = asyncio.create_task(processor.run())
    try:
        await produce_pings(kafka_bootstrap, source, range(10))

        async def all_handled() -> bool:
            return len(handled) >= 10

        await _until(all_handled)
        await asyncio.sleep(0.5)
        # Ten idle records handled, nothing committed: the idle timer (60 s) has not fired.
        assert await _committed(kafka_bootstrap, group, source) is None
        assert processor.stats.offsets_deferred >= 1
        await produce_pings(kafka_bootstrap, source, [100])

        async def committed_through_the_output() -> bool:
            return await _committed(kafka_bootstrap, group, source) == 11

        await _until(committed_through_the_output)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)

    # A short idle timer commits idle input on its own, without any output.
    quick = Processor(
        _settings(kafka_bootstrap, source, group, idle_commit_ms=200), handle, registry=REGISTRY
    )
    task = asyncio.create_task(quick.run())
    try:
        await produce_pings(kafka_bootstrap, source, range(20, 25))

        async def committed_by_the_timer() -> bool:
            return await _committed(kafka_bootstrap, group, source) == 16

        await _until(committed_by_the_timer)
        assert quick.stats.outputs_sent == 0
    finally:
        quick.request_stop()
        await asyncio.wait_for(task, timeout=30)


async def test_a_stop_commits_what_idle_batches_held_back(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = (await topic_factory(partitions=1)).name
    group = f"g-{uuid.uuid4().hex[:8]}"
    handled: list[int] = []

    def fold(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        handled.append(1)
        return []

    processor = Processor(
        _settings(kafka_bootstrap, source, group, idle_commit_ms=60_000), fold, registry=REGISTRY
    )
    task = asyncio.create_task(processor.run())
    try:
        await produce_pings(kafka_bootstrap, source, range(7))

        async def all_handled() -> bool:
            return len(handled) >= 7

        await _until(all_handled)
        assert await _committed(kafka_bootstrap, group, source) is None
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert await _committed(kafka_bootstrap, group, source) == 7
