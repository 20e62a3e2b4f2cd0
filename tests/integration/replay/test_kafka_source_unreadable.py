"""Reading the log from Kafka: records that are not JSON objects (garbage a producer wrote to
jobs.requests, dead-lettered by admission) are skipped and counted, not a reason to stop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from aiokafka import AIOKafkaProducer

from gangline.bus.admin import TopicSpec
from gangline.bus.security import client_options
from gangline.events.codec import dumps
from gangline.replay.kafka import KafkaSource

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]


def _request(n: int) -> bytes:
    return dumps(
        {
            "specversion": "1.0",
            "id": f"req-{n}",
            "source": "test",
            "type": "gangline.job.requested.v1",
            "time": "2026-01-01T00:00:00Z",
            "subject": f"job-{n}",
            "data": {"job_id": f"job-{n}", "queue": "default", "workers": 1, "gpus_per_worker": 1},
        }
    )


async def test_unreadable_records_are_skipped_and_counted(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = (await topic_factory(partitions=1)).name
    garbage = [
        b"not json at all",
        b'{"specversion": "1.0", "id": ',
        b"\xff\xfe\x00garbage",
        b"[1, 2]",
        b"[" * 10_000 + b"]" * 10_000,  # json.loads would raise RecursionError
    ]
    values = [_request(0), garbage[0], _request(1), garbage[1], garbage[2], _request(2), *garbage[3:]]
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, **client_options(), enable_idempotence=True
    )
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value=value, key=b"k")
    finally:
        await producer.stop()

    source = KafkaSource(kafka_bootstrap)
    records = await source.fetch([topic])

    assert [r.event_id for r in records] == ["req-0", "req-1", "req-2"]
    assert [r.offset for r in records] == [0, 2, 5]
    assert source.skipped == {topic: len(garbage)}
    assert [u.split(":")[0] for u in source.unreadable] == [f"{topic}[0]@{o}" for o in (1, 3, 4, 6, 7)]
