"""Held-back offsets: batches that publish nothing (and, without offsets_in_every_transaction, every
batch) leave their offsets to a publishing batch or the idle timer; rebalances neither lose nor redo input."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from bus_kafka_helpers import REGISTRY, Ping, envelopes, pong_handler, produce_pings, read_all

from gangline.bus import Outgoing, Processor, ProcessorSettings, RecordMeta
from gangline.bus.admin import TopicSpec
from gangline.bus.security import client_options
from gangline.events.base import Envelope

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]


def _settings(
    bootstrap: str, topic: str, group: str, idle_commit_ms: int, *, every_transaction: bool = True
) -> ProcessorSettings:
    return ProcessorSettings(
        bootstrap_servers=bootstrap,
        service="idle",
        instance_id="idle-0",
        group_id=group,
        input_topics=(topic,),
        max_batch_records=5,
        poll_timeout_ms=50,
        idle_commit_ms=idle_commit_ms,
        offsets_in_every_transaction=every_transaction,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=500,
    )


async def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, **client_options(), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        committed: int | None = await consumer.committed(TopicPartition(topic, 0))
        return committed
    finally:
        await consumer.stop()


async def _until_committed(bootstrap: str, group: str, topic: str, offset: int) -> None:
    async def committed() -> bool:
        return await _committed(bootstrap, group, topic) == offset

    await _until(committed)


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

        await _until_committed(kafka_bootstrap, group, source, 11)
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

        await _until_committed(kafka_bootstrap, group, source, 16)
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


async def test_without_offsets_in_every_transaction_outputs_commit_and_offsets_follow_on_the_timer(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = (await topic_factory(partitions=1)).name
    sink = (await topic_factory(partitions=1)).name
    group = f"g-{uuid.uuid4().hex[:8]}"
    processor = Processor(
        _settings(kafka_bootstrap, source, group, idle_commit_ms=60_000, every_transaction=False),
        pong_handler(sink),
        registry=REGISTRY,
    )
    task = asyncio.create_task(processor.run())
    try:
        await produce_pings(kafka_bootstrap, source, range(8))
        # Every output is committed (a read_committed reader sees it) while the offsets wait.
        pongs = envelopes(await read_all(kafka_bootstrap, sink, at_least=8))
        assert sorted(e.data.n for e in pongs) == list(range(8))  # type: ignore[attr-defined]
        assert await _committed(kafka_bootstrap, group, source) is None
        assert processor.stats.outputs_sent == 8 and processor.stats.offsets_deferred >= 1
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)
    # A stop commits them; so does the idle timer, without a stop.
    assert await _committed(kafka_bootstrap, group, source) == 8
    timed = Processor(
        _settings(kafka_bootstrap, source, group, idle_commit_ms=200, every_transaction=False),
        pong_handler(sink),
        registry=REGISTRY,
    )
    task = asyncio.create_task(timed.run())
    try:
        await produce_pings(kafka_bootstrap, source, range(8, 12))

        await _until_committed(kafka_bootstrap, group, source, 12)
    finally:
        timed.request_stop()
        await asyncio.wait_for(task, timeout=30)


@pytest.mark.parametrize("every_transaction", [False, True])
async def test_partitions_given_back_after_a_rebalance_resume_after_what_this_run_committed(
    kafka_bootstrap: str, topic_factory: TopicFactory, every_transaction: bool
) -> None:
    """Held-back offsets are not committed when a rebalance takes the partitions; handed back, the run
    goes on where it was instead of handling (and, with a replay cache, publishing) inputs again. And a
    batch polled across the rebalance is read again, not lost."""
    source = (await topic_factory(partitions=2)).name
    sink = (await topic_factory(partitions=1)).name
    group = f"g-{uuid.uuid4().hex[:8]}"
    pong = pong_handler(sink)
    handled: list[int] = []
    remembered: dict[str, Sequence[Outgoing]] = {}

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        # Like the services' shell: an event handled before gets the outputs of its first call.
        assert isinstance(envelope.data, Ping)
        handled.append(envelope.data.n)
        if envelope.id not in remembered:
            remembered[envelope.id] = pong(envelope, meta)
        return remembered[envelope.id]

    processor = Processor(
        _settings(kafka_bootstrap, source, group, idle_commit_ms=60_000, every_transaction=every_transaction),
        handle,
        registry=REGISTRY,
    )
    task = asyncio.create_task(processor.run())
    try:
        await asyncio.wait_for(processor.started.wait(), timeout=30)
        await produce_pings(kafka_bootstrap, source, range(6))

        async def handled_first() -> bool:
            return len(handled) >= 6

        await _until(handled_first)
        if not every_transaction:
            assert await _committed(kafka_bootstrap, group, source) is None
        # Another member joins (the processor gives up a partition), then leaves (it gets it back).
        other = AIOKafkaConsumer(
            source,
            bootstrap_servers=kafka_bootstrap,
            **client_options(),
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=500,
        )
        await other.start()
        try:
            await asyncio.wait_for(_until_assigned(other), timeout=30)
        finally:
            await other.stop()
        await produce_pings(kafka_bootstrap, source, range(6, 10))

        async def handled_all() -> bool:
            return set(range(10)) <= set(handled)

        try:
            await _until(handled_all)
        except AssertionError:
            raise AssertionError(f"handled {handled}") from None
        await asyncio.sleep(1.0)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert sorted(handled) == list(range(10)), "an input was handled twice"
    pongs = envelopes(await read_all(kafka_bootstrap, sink, at_least=10))
    assert sorted(e.data.n for e in pongs) == list(range(10))  # type: ignore[attr-defined]


async def _until_assigned(consumer: AIOKafkaConsumer) -> None:
    while not consumer.assignment():
        await consumer.getmany(timeout_ms=200)
