"""Shared pieces of the bus integration tests: two tiny event types, a handler, and log readers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import ClassVar, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord
from pydantic import Field

from gangline.bus import Outgoing, RecordMeta
from gangline.bus.security import client_options
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import decode, encode
from gangline.events.registry import Registry

NOW = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


class Ping(Event):
    """An input: "please answer ping n of this job"."""

    TYPE: ClassVar[str] = "test.ping"
    VERSION: ClassVar[int] = 1
    job_id: str
    n: int = Field(ge=0)

    def subject(self) -> str:
        return self.job_id


class Pong(Event):
    """The output the test handler makes of each ping."""

    TYPE: ClassVar[str] = "test.pong"
    VERSION: ClassVar[int] = 1
    job_id: str
    n: int

    def subject(self) -> str:
        return self.job_id


REGISTRY = Registry([Ping, Pong])


def ping(n: int, job: str | None = None) -> Envelope:
    return make_envelope(
        Ping(job_id=job or f"job-{n % 3}", n=n), event_id=f"ping-{n}", source="test", time=NOW
    )


def pong_handler(output_topic: str):  # type: ignore[no-untyped-def]
    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        assert isinstance(envelope.data, Ping)
        pong = Pong(job_id=envelope.data.job_id, n=envelope.data.n)
        return [(output_topic, make_envelope(pong, event_id=f"pong-{pong.n}", source="test/pong", time=NOW))]

    return handle


async def produce_raw(bootstrap: str, topic: str, values: Sequence[bytes], key: bytes = b"job-0") -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_options(), enable_idempotence=True)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()


async def produce_pings(bootstrap: str, topic: str, numbers: Sequence[int]) -> None:
    await produce_raw(bootstrap, topic, [encode(ping(n)) for n in numbers])


async def read_all(
    bootstrap: str,
    topic: str,
    *,
    isolation: Literal["read_committed", "read_uncommitted"] = "read_committed",
    at_least: int = 0,
    partitions_count: int = 1,
    timeout_s: float = 20.0,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` up to its current end (the LSO when read_committed).

    Waits until at least ``at_least`` records are there (or ``timeout_s`` passes; the caller's
    assertion then says what was missing).
    """
    deadline = time.monotonic() + timeout_s
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, **client_options(), isolation_level=isolation, enable_auto_commit=False
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(partitions_count)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records: list[ConsumerRecord[bytes, bytes]] = []
        while True:
            ends = await consumer.end_offsets(partitions)
            while time.monotonic() < deadline:
                positions = {tp: await consumer.position(tp) for tp in partitions}
                if all(positions[tp] >= ends[tp] for tp in partitions):
                    break
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
            if len(records) >= at_least or time.monotonic() > deadline:
                return records
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()


def envelopes(records: Sequence[ConsumerRecord[bytes, bytes]]) -> list[Envelope]:
    return [decode(record.value or b"", REGISTRY) for record in records]
