"""The hash chain written by the bus (Processor and EventProducer) against the real broker."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest
from aiokafka.partitioner import DefaultPartitioner
from bus_kafka_helpers import NOW, REGISTRY, Pong, ping, pong_handler, produce_pings, read_all

from gangline.bus import BatchInfo, EventProducer, Processor, ProcessorSettings
from gangline.bus.admin import TopicSpec
from gangline.bus.chain import partition_for
from gangline.events.base import Envelope, make_envelope
from gangline.events.chain import SEQ_HEADER
from gangline.replay.chain import verify_chain
from gangline.replay.kafka import to_log_record
from gangline.replay.log import LogRecord

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]
"""The ``topic_factory`` fixture (tests/conftest.py)."""

PARTITIONS = 3


def _settings(bootstrap: str, source: str, sink: str, group: str) -> ProcessorSettings:
    return ProcessorSettings(
        bootstrap_servers=bootstrap,
        service="pong",
        instance_id="pong-0",
        group_id=group,
        input_topics=(source,),
        max_batch_records=4,
        poll_timeout_ms=100,
        retry_backoff_s=0.05,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
        chained_topics=(sink,),
    )


async def _committed(bootstrap: str, topic: str, at_least: int) -> list[LogRecord]:
    records = await read_all(bootstrap, topic, at_least=at_least, partitions_count=PARTITIONS, timeout_s=30)
    return [to_log_record(r) for r in records]


async def _run_until(processor: Processor, bootstrap: str, topic: str, count: int) -> list[LogRecord]:
    task = asyncio.create_task(processor.run())
    try:
        return await _committed(bootstrap, topic, count)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)


def test_the_partition_is_the_default_partitioners() -> None:
    partitions = list(range(7))
    for key in (b"job-0", b"job-1", b"a-much-longer-job-id-0123456789", b""):
        assert partition_for(key, 7) == DefaultPartitioner()(key, partitions, partitions)


async def test_a_processor_chains_through_aborts_and_a_restart(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    await produce_pings(kafka_bootstrap, source.name, range(12))
    attempts: Counter[int] = Counter()

    async def abort_every_other_first_attempt(batch: BatchInfo) -> None:
        attempts[batch.attempt] += 1
        if batch.attempt == 1 and attempts[1] % 2 == 1:
            raise ConnectionError("simulated crash between produce and commit")

    first = Processor(
        _settings(kafka_bootstrap, source.name, sink.name, group),
        pong_handler(sink.name),
        registry=REGISTRY,
        before_commit=abort_every_other_first_attempt,
    )
    await _run_until(first, kafka_bootstrap, sink.name, 12)
    assert first.stats.batches_aborted >= 2

    # A new incarnation resumes every chain from the log's tail, and aborts again on the way.
    await produce_pings(kafka_bootstrap, source.name, range(12, 24))
    second = Processor(
        _settings(kafka_bootstrap, source.name, sink.name, group),
        pong_handler(sink.name),
        registry=REGISTRY,
        before_commit=abort_every_other_first_attempt,
    )
    records = await _run_until(second, kafka_bootstrap, sink.name, 24)
    assert second.stats.batches_aborted >= 1

    report = verify_chain(records, topics=[sink.name])
    assert report.problems == []
    assert report.records == 24
    # Every record is where the default partitioner puts its key, one chain per partition.
    assert all(r.partition == partition_for((r.key or "").encode(), PARTITIONS) for r in records)
    chains_by_partition = Counter(r.partition for r in records)
    assert report.heads.keys() == {f"{sink.name}[{p}]/test/pong" for p in chains_by_partition}
    assert {cid: seq for cid, (seq, _) in report.heads.items()} == {
        f"{sink.name}[{p}]/test/pong": n - 1 for p, n in chains_by_partition.items()
    }
    # The aborted attempts were stamped too: what a read_uncommitted reader sees does not verify.
    uncommitted = await read_all(
        kafka_bootstrap, sink.name, isolation="read_uncommitted", at_least=25, partitions_count=PARTITIONS
    )
    assert not verify_chain([to_log_record(r) for r in uncommitted], topics=[sink.name]).ok


async def test_an_event_producer_resumes_its_chain_after_a_restart(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = (await topic_factory(partitions=PARTITIONS)).name

    def released(n: int, source: str) -> Envelope:
        return make_envelope(
            Pong(job_id=f"job-{n % 4}", n=n), event_id=f"{source}-{n}", source=source, time=NOW
        )

    for run in range(3):
        async with (
            EventProducer(kafka_bootstrap, chained_topics=[topic]) as a,
            EventProducer(kafka_bootstrap, chained_topics=[topic]) as b,
        ):
            for n in range(run * 5, run * 5 + 5):
                await a.publish(topic, released(n, "agent/a"))
                await b.publish(topic, released(n, "agent/b"))
        # An unchained publisher on another topic is left alone.
        async with EventProducer(kafka_bootstrap, chained_topics=["elsewhere"]) as plain:
            await plain.publish(topic, ping(100 + run))

    records = await _committed(kafka_bootstrap, topic, 33)
    chained = [r for r in records if r.envelope.get("source") != "test"]
    unchained = [r for r in records if r.envelope.get("source") == "test"]
    assert len(chained) == 30
    assert all(SEQ_HEADER not in r.headers for r in unchained)
    report = verify_chain(chained, topics=[topic])
    assert report.problems == []
    per_chain = Counter(f"{r.topic}[{r.partition}]/{r.envelope['source']}" for r in chained)
    assert {cid: seq for cid, (seq, _) in report.heads.items()} == {
        cid: n - 1 for cid, n in per_chain.items()
    }
    # Restarts continued the chains rather than starting new ones at seq 0.
    assert max(int(r.headers[SEQ_HEADER]) for r in chained) >= 5
    assert verify_chain(records, topics=[topic]).problems[0].kind == "unchained"
