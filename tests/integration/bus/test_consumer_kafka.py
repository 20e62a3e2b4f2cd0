"""The typed producer and consumer against the real broker."""

from __future__ import annotations

import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from bus_kafka_helpers import REGISTRY, Ping, ping, read_all

from gangline.bus import DLQ_CODE, DLQ_SOURCE_SERVICE, Delivery, EventConsumer, EventProducer, header
from gangline.bus.security import client_options

pytestmark = pytest.mark.kafka


async def test_publish_keys_by_subject_and_the_consumer_dead_letters_garbage(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, topic_factory
) -> None:
    topic = await topic_factory(partitions=1)
    async with EventProducer(kafka_bootstrap) as producer:
        first = await producer.publish(topic.name, ping(1, job="job-a"))
        raw = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, **client_options())
        await raw.start()
        try:
            await raw.send_and_wait(topic.name, value=b"garbage", key=b"job-b", headers=[("origin", b"test")])
        finally:
            await raw.stop()
        await producer.publish(topic.name, ping(3, job="job-c"), key="override")
    assert first.offset == 0

    deliveries: list[Delivery] = []
    async with EventConsumer(
        kafka_bootstrap,
        [topic.name],
        service="ledger",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        registry=REGISTRY,
    ) as consumer:
        deadline = time.monotonic() + 20
        while len(deliveries) < 2 and time.monotonic() < deadline:
            deliveries += await consumer.getmany(timeout_ms=200)
        await consumer.commit()

    assert [d.envelope.data for d in deliveries] == [Ping(job_id="job-a", n=1), Ping(job_id="job-c", n=3)]
    assert [d.meta.key for d in deliveries] == [b"job-a", b"override"]
    assert [d.meta.offset for d in deliveries] == [0, 2]
    # What was published comes back as it was (bar the traceparent the producer may stamp).
    assert deliveries[0].envelope.model_copy(update={"traceparent": None}) == ping(1, job="job-a")
    (letter,) = await read_all(kafka_bootstrap, topic.dead_letter or "", at_least=1)
    assert (letter.value, letter.key) == (b"garbage", b"job-b")
    assert header(letter.headers, "origin") == b"test"
    assert header(letter.headers, DLQ_CODE) == b"malformed_message"
    assert header(letter.headers, DLQ_SOURCE_SERVICE) == b"ledger"
