"""The processor's opt-in input positions: every output of a transaction names how far each input
partition had been folded (the restore's offsets included), on the real broker, aborts included."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable

import pytest
from bus_kafka_helpers import REGISTRY, Pong, envelopes, pong_handler, produce_pings, read_all

from gangline.bus import BatchInfo, Processor, ProcessorSettings
from gangline.bus.admin import TopicSpec
from gangline.bus.positions import INCARNATION_HEADER, INPUTS_HEADER, parse_positions
from gangline.bus.processor import InputRecording
from gangline.events.codec import decode

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]


def _settings(bootstrap: str, topic: str) -> ProcessorSettings:
    return ProcessorSettings(
        bootstrap_servers=bootstrap,
        service="pong",
        instance_id="pong-0",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        input_topics=(topic,),
        max_batch_records=3,
        poll_timeout_ms=100,
        retry_backoff_s=0.05,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
    )


async def _run(processor: Processor, bootstrap: str, sink: str, count: int) -> None:
    task = asyncio.create_task(processor.run())
    try:
        await read_all(bootstrap, sink, at_least=count, timeout_s=30)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)


async def test_each_output_names_the_input_positions_its_batch_was_decided_on(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = await topic_factory(partitions=2)
    sink = await topic_factory(partitions=1)
    await produce_pings(kafka_bootstrap, source.name, range(12))
    failures = iter([False, True])  # the second batch aborts once and is retried

    async def crash_once(batch: BatchInfo) -> None:
        if next(failures, False):
            raise ConnectionError("simulated crash between produce and commit")

    restored = {("elsewhere.topic", 0): 7}
    processor = Processor(
        _settings(kafka_bootstrap, source.name),
        pong_handler(sink.name),
        registry=REGISTRY,
        before_commit=crash_once,
        inputs=InputRecording("run-a", restored),
    )
    await _run(processor, kafka_bootstrap, sink.name, 12)

    inputs = await read_all(kafka_bootstrap, source.name, partitions_count=2)
    where = {decode(r.value or b"", REGISTRY).id: (r.partition, r.offset) for r in inputs}
    outputs = await read_all(kafka_bootstrap, sink.name, at_least=12)
    assert processor.stats.batches_aborted == 1
    assert sorted(e.data.n for e in envelopes(outputs) if isinstance(e.data, Pong)) == list(range(12))
    seen: list[dict[tuple[str, int], int]] = []
    for record in outputs:
        headers = {k: v.decode() for k, v in record.headers}
        assert headers[INCARNATION_HEADER] == "run-a"
        positions = parse_positions(headers[INPUTS_HEADER])
        envelope = decode(record.value or b"", REGISTRY)
        partition, offset = where[str(envelope.causationid)]
        # The batch had folded its cause; the restore's position is carried along.
        assert positions[(source.name, partition)] >= offset + 1
        assert positions[("elsewhere.topic", 0)] == 7
        seen.append(positions)
    # Cumulative and never going back (the aborted attempt left no trace).
    assert all(
        later.get(tp, 0) >= offset
        for earlier, later in itertools.pairwise(seen)
        for tp, offset in earlier.items()
    )
    ends: dict[tuple[str, int], int] = {}
    for r in inputs:
        ends[(source.name, r.partition)] = r.offset + 1
    assert {tp: o for tp, o in seen[-1].items() if tp[0] == source.name} == ends


async def test_without_recording_outputs_carry_no_positions(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    await produce_pings(kafka_bootstrap, source.name, range(3))
    processor = Processor(_settings(kafka_bootstrap, source.name), pong_handler(sink.name), registry=REGISTRY)
    await _run(processor, kafka_bootstrap, sink.name, 3)

    outputs = await read_all(kafka_bootstrap, sink.name, at_least=3)
    assert len(outputs) == 3
    assert all(INPUTS_HEADER not in {k for k, _ in r.headers} for r in outputs)
