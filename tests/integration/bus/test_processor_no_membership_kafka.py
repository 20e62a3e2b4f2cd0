"""The processor without group membership (the one leader behind a lock): it reads every partition of
its inputs, and a successor with the same group goes on from the committed offsets at once, while the
one before it is still a member of nothing (nothing to wait for), deciding nothing twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from bus_kafka_helpers import REGISTRY, Pong, envelopes, ping, pong_handler, produce_raw, read_all

from gangline.bus import Processor, ProcessorSettings
from gangline.events.codec import encode

pytestmark = pytest.mark.kafka


async def produce_spread(bootstrap: str, topic: str, numbers: range) -> None:
    """Pings keyed one by one, so they land on every partition."""
    for n in numbers:
        await produce_raw(bootstrap, topic, [encode(ping(n))], key=f"key-{n}".encode())


def _settings(bootstrap: str, topic: str, group: str, instance: str) -> ProcessorSettings:
    return ProcessorSettings(
        bootstrap_servers=bootstrap,
        service="pong",
        instance_id=instance,
        group_id=group,
        input_topics=(topic,),
        max_batch_records=5,
        poll_timeout_ms=100,
        retry_backoff_s=0.05,
        transactional_role="leader",
        group_membership=False,
    )


async def test_a_processor_without_membership_reads_every_partition_and_its_successor_resumes(
    kafka_bootstrap: str,
    topic_factory,  # type: ignore[no-untyped-def]
) -> None:
    source = await topic_factory(partitions=3)
    sink = await topic_factory(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    await produce_spread(kafka_bootstrap, source.name, range(12))
    first = Processor(
        _settings(kafka_bootstrap, source.name, group, "a"), pong_handler(sink.name), registry=REGISTRY
    )
    task = asyncio.create_task(first.run())
    await read_all(kafka_bootstrap, sink.name, at_least=12, timeout_s=30)
    task.cancel()  # no stop, no leaving: as a crashed leader
    with pytest.raises(asyncio.CancelledError):
        await task
    assert {tp.partition for tp in first._handled} == {0, 1, 2}

    await produce_spread(kafka_bootstrap, source.name, range(12, 20))
    second = Processor(
        _settings(kafka_bootstrap, source.name, group, "b"), pong_handler(sink.name), registry=REGISTRY
    )
    task = asyncio.create_task(second.run())
    try:
        outputs = envelopes(await read_all(kafka_bootstrap, sink.name, at_least=20, timeout_s=30))
    finally:
        second.request_stop()
        await asyncio.wait_for(task, timeout=30)
    counts = Counter(e.data.n for e in outputs if isinstance(e.data, Pong))
    assert sorted(counts) == list(range(20))
    assert [n for n, c in counts.items() if c != 1] == []
