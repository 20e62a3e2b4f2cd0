"""``EventProducer.publish_many``: many envelopes in one go against the real broker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar

import pytest
from aiokafka.errors import MessageSizeTooLargeError
from bus_kafka_helpers import NOW, REGISTRY, Pong, ping, read_all

from gangline.bus import EventProducer
from gangline.bus.admin import TopicSpec
from gangline.events.base import Event, make_envelope
from gangline.events.codec import decode
from gangline.replay.chain import verify_chain
from gangline.replay.kafka import to_log_record

pytestmark = pytest.mark.kafka


class Blob(Event):
    TYPE: ClassVar[str] = "test.blob"
    VERSION: ClassVar[int] = 1
    job_id: str
    blob: str

    def subject(self) -> str:
        return self.job_id


TopicFactory = Callable[..., Awaitable[TopicSpec]]
"""The ``topic_factory`` fixture (tests/conftest.py)."""


async def test_publish_many_keeps_the_order_and_reports_each_outcome(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = (await topic_factory(partitions=1)).name
    # Over the producer's request size (1 MiB): refused when queued, the records after it still go.
    too_big = make_envelope(
        Blob(job_id="job-0", blob="x" * 2_000_000), event_id="big", source="test", time=NOW
    )
    items = [(topic, ping(n, job="job-0")) for n in range(3)] + [(topic, too_big)]
    items += [(topic, ping(n, job="job-0")) for n in range(3, 6)]
    async with EventProducer(kafka_bootstrap) as producer:
        outcomes = await producer.publish_many(items)

    assert isinstance(outcomes[3], MessageSizeTooLargeError)
    delivered = [o for i, o in enumerate(outcomes) if i != 3]
    assert not any(isinstance(o, BaseException) for o in delivered)
    assert [o.offset for o in delivered] == list(range(6))  # type: ignore[union-attr]
    records = await read_all(kafka_bootstrap, topic, at_least=6)
    assert [decode(r.value, REGISTRY).data.n for r in records] == [0, 1, 2, 3, 4, 5]  # type: ignore[attr-defined]


async def test_publish_many_continues_the_hash_chain(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = (await topic_factory(partitions=3)).name
    items = [
        (
            topic,
            make_envelope(Pong(job_id=f"job-{n % 4}", n=n), event_id=f"p-{n}", source="agent/a", time=NOW),
        )
        for n in range(12)
    ]
    async with EventProducer(kafka_bootstrap, chained_topics=[topic]) as producer:
        await producer.publish(topic, items[0][1])
        outcomes = await producer.publish_many(items[1:])
    assert not any(isinstance(o, BaseException) for o in outcomes)

    records = await read_all(kafka_bootstrap, topic, at_least=12, partitions_count=3)
    report = verify_chain([to_log_record(r) for r in records], topics=[topic])
    assert report.problems == []
    assert sum(seq + 1 for seq, _ in report.heads.values()) == 12
