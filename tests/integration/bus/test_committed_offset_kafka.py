"""The committed offset of a transactional input steps over its commit markers (KAFKA-6607): once the
processor is caught up, the group's committed offset is the partition's end offset, so lag as
``kafka-consumer-groups.sh`` counts it (end offset less committed offset) reads 0, and so does the
processor's own :meth:`~gangline.bus.Processor.consumer_lag`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from bus_kafka_helpers import REGISTRY, Ping, ping, pong_handler

from gangline.bus import Outgoing, Processor, ProcessorSettings, RecordMeta
from gangline.bus.admin import TopicSpec
from gangline.bus.security import client_options
from gangline.events.base import Envelope
from gangline.events.codec import encode

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]


async def _produce_in_transactions(bootstrap: str, topic: str, batches: Sequence[range]) -> None:
    """Each batch of pings in a transaction of its own: every batch ends with a commit marker."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **client_options(),
        transactional_id=f"tx-{uuid.uuid4().hex[:8]}",
        enable_idempotence=True,
    )
    await producer.start()
    try:
        for numbers in batches:
            async with producer.transaction():
                for n in numbers:
                    await producer.send(topic, value=encode(ping(n)), key=b"job-0")
    finally:
        await producer.stop()


async def _group_view(bootstrap: str, group: str, topic: str) -> tuple[int | None, int]:
    """(the group's committed offset, the partition's end offset), as the Kafka tools read them."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, **client_options(), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        committed: int | None = await consumer.committed(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        return committed, end
    finally:
        await consumer.stop()


def _settings(bootstrap: str, topic: str, group: str, *, every_transaction: bool) -> ProcessorSettings:
    return ProcessorSettings(
        bootstrap_servers=bootstrap,
        service="lag",
        instance_id="lag-0",
        group_id=group,
        input_topics=(topic,),
        max_batch_records=4,
        poll_timeout_ms=50,
        idle_commit_ms=100,
        offsets_in_every_transaction=every_transaction,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=500,
    )


@pytest.mark.parametrize("every_transaction", [True, False])
async def test_lag_reads_zero_once_a_transactional_input_is_caught_up(
    kafka_bootstrap: str, topic_factory: TopicFactory, every_transaction: bool
) -> None:
    source = (await topic_factory(partitions=1)).name
    sink = (await topic_factory(partitions=1)).name
    group = f"g-{uuid.uuid4().hex[:8]}"
    pong = pong_handler(sink)
    handled: list[int] = []

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        assert isinstance(envelope.data, Ping)
        handled.append(envelope.data.n)
        return pong(envelope, meta) if envelope.data.n % 2 else []  # some batches publish nothing

    # Batches of 3 records + 1 marker, read 4 records at a time: markers land inside and at the ends of polls.
    await _produce_in_transactions(kafka_bootstrap, source, [range(i, i + 3) for i in range(0, 15, 3)])
    processor = Processor(
        _settings(kafka_bootstrap, source, group, every_transaction=every_transaction),
        handle,
        registry=REGISTRY,
    )
    task = asyncio.create_task(processor.run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            committed, end = await _group_view(kafka_bootstrap, group, source)
            if committed == end and processor.consumer_lag() == {source: 0}:
                break
            assert not task.done(), "the processor stopped"
            assert loop.time() < deadline, f"never caught up: committed {committed}, end {end}"
            await asyncio.sleep(0.1)
        # Five transactions of three records: the end is past five markers, and the commit with it.
        assert end == 20
        assert sorted(set(handled)) == list(range(15))

        # More input, again transactional: lag shows it until it is handled, then reads 0 again.
        await _produce_in_transactions(kafka_bootstrap, source, [range(15, 17)])
        while True:
            committed, end = await _group_view(kafka_bootstrap, group, source)
            if end == 23 and committed == end and processor.consumer_lag() == {source: 0}:
                break
            assert not task.done(), "the processor stopped"
            assert loop.time() < deadline, f"never caught up: committed {committed}, end {end}"
            await asyncio.sleep(0.1)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)
