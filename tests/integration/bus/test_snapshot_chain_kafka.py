"""A snapshot carries the hash chains' heads as the log has them, even when it is taken in a batch that
stamped nothing (the heads not read yet this run), on the real broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

import pytest
from bus_kafka_helpers import NOW, REGISTRY, Pong, produce_pings, read_all

from gangline.bus import Processor, ProcessorSettings
from gangline.bus.admin import TopicSpec
from gangline.bus.chain import ChainKey
from gangline.bus.positions import Partition
from gangline.bus.processor import InputRecording
from gangline.bus.producer import EventProducer
from gangline.bus.snapshots import SnapshotRecord
from gangline.events.base import make_envelope

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]


class EveryBatch:
    """A snapshot writer due at every batch, keeping the heads it was given."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.heads: list[Mapping[ChainKey, tuple[int, str]]] = []

    def due(self, events: int) -> bool:
        return True

    def records(
        self, positions: Mapping[Partition, int], events: int, chain_heads: Mapping[ChainKey, tuple[int, str]]
    ) -> Sequence[SnapshotRecord]:
        self.heads.append(dict(chain_heads))
        return [SnapshotRecord(b"manifest", b"{}", ())]

    def committed(self, written: bool, events: int) -> None:
        pass

    def aborted(self, error: Exception) -> None:
        pass


async def test_a_snapshot_in_a_batch_that_stamped_nothing_carries_the_logs_chain_heads(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = await topic_factory(partitions=1)
    chained = await topic_factory(partitions=1)
    snapshots = await topic_factory(partitions=1, cleanup_policy="compact")
    async with EventProducer(kafka_bootstrap, chained_topics=[chained.name]) as producer:
        for n in range(3):
            pong = make_envelope(Pong(job_id="job-0", n=n), event_id=f"p{n}", source="agent/a", time=NOW)
            await producer.publish(chained.name, pong)
    await produce_pings(kafka_bootstrap, source.name, range(2))
    writer = EveryBatch(snapshots.name)
    settings = ProcessorSettings(
        bootstrap_servers=kafka_bootstrap,
        service="quiet",
        instance_id="quiet-0",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        input_topics=(source.name,),
        poll_timeout_ms=100,
        chained_topics=(chained.name,),
    )
    processor = Processor(
        settings,
        lambda envelope, meta: [],  # decides nothing: nothing is stamped
        registry=REGISTRY,
        inputs=InputRecording("run"),
        snapshots=writer,
    )
    task = asyncio.create_task(processor.run())
    try:
        await read_all(kafka_bootstrap, snapshots.name, at_least=1, timeout_s=30)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert writer.heads
    assert writer.heads[0][(chained.name, 0, "agent/a")][0] == 3  # the next seq after the three written
