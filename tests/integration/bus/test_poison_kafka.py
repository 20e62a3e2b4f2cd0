"""Poison records against the real broker: whatever fails outside the handler is retried a bounded
number of times, found record by record, dead-lettered with its reason and skipped; good records
around it are published; dead letters always fit the broker's 1 MiB limit."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import ClassVar

import pytest
from aiokafka import AIOKafkaProducer
from bus_kafka_helpers import NOW, REGISTRY, Ping, Pong, envelopes, ping, pong_handler, read_all

from gangline.bus import (
    DLQ_CODE,
    DLQ_OFFSET,
    DLQ_REASON,
    DLQ_TRUNCATED,
    DLQ_VALUE_SHA256,
    DLQ_VALUE_SIZE,
    MAX_DEAD_LETTER_BYTES,
    BatchInfo,
    DeadLetter,
    Outgoing,
    Processor,
    ProcessorSettings,
    RecordMeta,
    header,
)
from gangline.bus.security import client_options
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import encode

pytestmark = pytest.mark.kafka


class Blob(Event):
    """An output of any size."""

    TYPE: ClassVar[str] = "test.blob"
    VERSION: ClassVar[int] = 1
    job_id: str
    text: str

    def subject(self) -> str:
        return self.job_id


def _settings(bootstrap: str, topic: str, **overrides: object) -> ProcessorSettings:
    values: dict[str, object] = {
        "bootstrap_servers": bootstrap,
        "service": "pong",
        "instance_id": "pong-0",
        "group_id": f"g-{uuid.uuid4().hex[:8]}",
        "input_topics": (topic,),
        "max_batch_records": 10,
        "poll_timeout_ms": 100,
        "retry_backoff_s": 0.01,
        "session_timeout_ms": 6_000,
        "heartbeat_interval_ms": 1_000,
    }
    values.update(overrides)
    return ProcessorSettings.model_validate(values)


async def _produce(bootstrap: str, topic: str, values: Sequence[bytes]) -> None:
    # Room for a record as large as the broker takes (1 MiB less a little framing).
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, **client_options(), enable_idempotence=True, max_request_size=2**21
    )
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value=value, key=b"job-0")
    finally:
        await producer.stop()


async def _run_until(processor: Processor, bootstrap: str, topic: str, count: int) -> list[Envelope]:
    task = asyncio.create_task(processor.run())
    try:
        records = await read_all(bootstrap, topic, at_least=count, timeout_s=60)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)
    return envelopes(records)


def _weight(record: object) -> int:
    headers = sum(len(k.encode()) + len(v) for k, v in record.headers)  # type: ignore[attr-defined]
    return len(record.value or b"") + len(record.key or b"") + headers  # type: ignore[attr-defined]


async def test_a_batch_failing_outside_the_handler_is_split_and_only_the_bad_record_is_dead_lettered(
    kafka_bootstrap: str, topic_factory
) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    await _produce(kafka_bootstrap, source.name, [encode(ping(n)) for n in range(8)])
    flushed: Counter[int] = Counter()

    def summary(given: Sequence[Envelope]) -> Sequence[Outgoing]:
        # A per-batch step with a bug that only ping 5 triggers (outside the handler).
        numbers = [e.data.n for e in given if isinstance(e.data, Ping)]
        flushed.update(numbers)
        if 5 in numbers:
            raise KeyError("a bug in the per-batch step")
        return [
            (sink.name, make_envelope(Pong(job_id="sum", n=n), event_id=f"sum-{n}", source="t", time=NOW))
            for n in numbers
        ]

    processor = Processor(
        _settings(kafka_bootstrap, source.name), lambda e, m: [], registry=REGISTRY, flush=summary
    )
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 7)

    assert sorted(e.data.n for e in outputs if isinstance(e.data, Pong)) == [0, 1, 2, 3, 4, 6, 7]
    (letter,) = await read_all(kafka_bootstrap, source.dead_letter or "", at_least=1)
    assert letter.value == encode(ping(5)) and header(letter.headers, DLQ_OFFSET) == b"5"
    assert header(letter.headers, DLQ_CODE) == b"processing_failed"
    assert b"KeyError" in (header(letter.headers, DLQ_REASON) or b"")
    # Bounded: 3 attempts of its batch, then 3 of ping 5 alone (3 in all had it been polled alone).
    assert 3 <= flushed[5] <= 3 + 3
    assert all(flushed[n] <= 3 + 1 for n in (0, 1, 2, 3, 4, 6, 7))


async def test_an_output_over_the_broker_limit_dead_letters_its_cause(
    kafka_bootstrap: str, topic_factory
) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    await _produce(kafka_bootstrap, source.name, [encode(ping(n)) for n in range(4)])
    inner = pong_handler(sink.name)

    def handler(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        assert isinstance(envelope.data, Ping)
        if envelope.data.n == 2:  # an output no broker takes
            huge = Blob(job_id="job-2", text="x" * (1024 * 1024 + 1))
            return [(sink.name, make_envelope(huge, event_id="blob-2", source="t", time=NOW))]
        return inner(envelope, meta)

    processor = Processor(_settings(kafka_bootstrap, source.name), handler, registry=REGISTRY)
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 3)

    assert sorted(e.data.n for e in outputs if isinstance(e.data, Pong)) == [0, 1, 3]
    (letter,) = await read_all(kafka_bootstrap, source.dead_letter or "", at_least=1)
    assert letter.value == encode(ping(2))
    assert header(letter.headers, DLQ_CODE) == b"output_too_large"


async def test_huge_deep_and_garbage_records_make_bounded_dead_letters_and_the_loop_goes_on(
    kafka_bootstrap: str, topic_factory
) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    garbage = bytes(range(256)) * 4090  # just under what the broker takes in one record
    big_subject = json.loads(encode(ping(1)))
    big_subject["subject"] = "s" * 900_000
    deep = b"[" * 10_000 + b"]" * 10_000
    values = [encode(ping(0)), garbage, json.dumps(big_subject).encode(), deep, encode(ping(4))]
    await _produce(kafka_bootstrap, source.name, values)
    rejections: list[DeadLetter] = []

    def answer(letter: DeadLetter) -> Sequence[Outgoing]:
        rejections.append(letter)
        return []

    processor = Processor(
        _settings(kafka_bootstrap, source.name),
        pong_handler(sink.name),
        registry=REGISTRY,
        dead_letter_outputs=answer,
    )
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 2)

    assert [e.data.n for e in outputs if isinstance(e.data, Pong)] == [0, 4]
    letters = await read_all(kafka_bootstrap, source.dead_letter or "", at_least=3)
    assert [header(x.headers, DLQ_OFFSET) for x in letters] == [b"1", b"2", b"3"]  # once each
    assert all(_weight(x) <= MAX_DEAD_LETTER_BYTES for x in letters)
    cut, subject, too_deep = letters
    assert header(cut.headers, DLQ_CODE) == b"malformed_message"
    assert header(cut.headers, DLQ_TRUNCATED) == b"value"
    assert header(cut.headers, DLQ_VALUE_SHA256) == hashlib.sha256(garbage).hexdigest().encode()
    assert header(cut.headers, DLQ_VALUE_SIZE) == str(len(garbage)).encode()
    assert garbage.startswith(cut.value or b"x")
    assert len(header(subject.headers, DLQ_REASON) or b"") < 1000
    assert header(subject.headers, DLQ_TRUNCATED) == b"value"  # 900 KB: over the room for a value
    assert header(too_deep.headers, DLQ_CODE) == b"malformed_message"
    assert b"64 levels" in (header(too_deep.headers, DLQ_REASON) or b"")
    assert len(rejections) == 3


async def test_an_outage_is_retried_for_as_long_as_it_lasts_and_dead_letters_nothing(
    kafka_bootstrap: str, topic_factory
) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    await _produce(kafka_bootstrap, source.name, [encode(ping(0))])
    failures = iter(range(8))

    async def flaky(batch: BatchInfo) -> None:
        if next(failures, None) is not None:
            raise ConnectionError("the broker is away")

    settings = _settings(kafka_bootstrap, source.name)
    processor = Processor(settings, pong_handler(sink.name), registry=REGISTRY, before_commit=flaky)
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 1)

    assert [e.data.n for e in outputs if isinstance(e.data, Pong)] == [0]
    assert processor.stats.batches_aborted == 8 and processor.stats.dead_lettered == 0
