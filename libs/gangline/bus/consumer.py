"""Typed consumer: Kafka records in, decoded envelopes out; undecodable records go to the DLQ.

For readers that do not produce in a transaction (projections, the API, the agent). A record
that fails to decode is never shown to the caller: it is copied to ``<topic>.dlq`` (raw bytes,
original key and headers, plus the ``gangline-dlq-*`` reason headers), and the DLQ write is
acknowledged before the caller sees any later record of the batch, so committing after
handling a delivery never skips a record that is in neither place. A record read again by the same
consumer (the caller rewound after a failed write) is not dead-lettered a second time.

Services that consume and produce use :class:`gangline.bus.processor.Processor` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gangline.bus.records import DeadLetter, KafkaRecord, RecordMeta, dead_letter
from gangline.bus.security import KafkaSecurity, client_options
from gangline.bus.trust import UNTRUSTED_WRITER, active_policy
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode
from gangline.events.registry import Registry


@dataclass(frozen=True, slots=True)
class Delivery:
    """One decoded event and where it came from."""

    envelope: Envelope
    meta: RecordMeta


def decode_or_dead_letter(
    record: KafkaRecord, *, registry: Registry | None, source_service: str
) -> Envelope | DeadLetter:
    """The record's envelope, or its dead-letter copy when it cannot be read or its writer may not have
    written it (:mod:`gangline.bus.trust`; expected outcomes)."""
    if record.value is None:
        return dead_letter(
            record,
            code="malformed_message",
            reason="the message has no value (a tombstone)",
            source_service=source_service,
        )
    try:
        envelope = decode(record.value, registry)
    except DecodeError as error:
        return dead_letter(record, code=error.code, reason=error.reason, source_service=source_service)
    policy = active_policy()
    if policy is not None:
        refused = policy.check(record.topic, record.key, record.value, record.headers, envelope)
        if refused is not None:
            return dead_letter(record, code=UNTRUSTED_WRITER, reason=refused, source_service=source_service)
    return envelope


class EventConsumer:
    """Reads envelopes from ``topics``; dead-letters what it cannot decode.

    ``service`` names this reader in the ``gangline-dlq-source-service`` header. Offsets are
    committed by the caller (:meth:`commit`) unless ``enable_auto_commit`` is set.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: Sequence[str],
        *,
        service: str,
        group_id: str | None,
        registry: Registry | None = None,
        enable_auto_commit: bool = False,
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
        isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed",
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        security: KafkaSecurity | None = None,
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._security = security
        self._topics = tuple(topics)
        self._service = service
        self._group_id = group_id
        self._registry = registry
        self._enable_auto_commit = enable_auto_commit
        self._auto_offset_reset = auto_offset_reset
        self._isolation_level = isolation_level
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._consumer: AIOKafkaConsumer | None = None
        self._dlq: AIOKafkaProducer | None = None
        self._read_up_to: dict[tuple[str, int], int] = {}
        """Per partition, the last offset whose record this consumer decoded (and dead-lettered when it
        could not be read): decoding is deterministic, so a bad record at or before it is in the DLQ."""
        self.dead_letters: dict[tuple[str, str], int] = {}
        """Records this consumer dead-lettered, per ``(dead-letter topic, code)`` (for the metrics)."""

    async def start(self) -> None:
        options = client_options(self._security)
        dlq = AIOKafkaProducer(**options, bootstrap_servers=self._bootstrap_servers, enable_idempotence=True)
        await dlq.start()
        consumer = AIOKafkaConsumer(
            *self._topics,
            **options,
            bootstrap_servers=self._bootstrap_servers,
            group_id=self._group_id,
            enable_auto_commit=self._enable_auto_commit,
            auto_offset_reset=self._auto_offset_reset,
            isolation_level=self._isolation_level,
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=self._heartbeat_interval_ms,
        )
        try:
            await consumer.start()
        except BaseException:
            await dlq.stop()
            raise
        self._dlq, self._consumer = dlq, consumer

    async def stop(self) -> None:
        consumer, dlq = self._consumer, self._dlq
        self._consumer = self._dlq = None
        try:
            if consumer is not None:
                await consumer.stop()
        finally:
            if dlq is not None:
                await dlq.stop()

    async def __aenter__(self) -> EventConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def raw(self) -> AIOKafkaConsumer:
        """The underlying aiokafka consumer (started)."""
        if self._consumer is None:
            raise RuntimeError("EventConsumer is not started")
        return self._consumer

    async def wait_for_assignment(self, timeout_s: float = 30.0) -> None:
        """Wait until the group hands this consumer partitions, then pin their start positions.

        A group member reading from ``latest`` misses what is written before its positions are
        fixed; callers that publish right after starting wait here first.
        """
        raw = self.raw
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not raw.assignment():
            if loop.time() > deadline:
                raise TimeoutError(f"the consumer of {self._service} got no partitions in {timeout_s:g} s")
            await asyncio.sleep(0.05)
        for tp in raw.assignment():
            await raw.position(tp)

    async def getmany(self, *, timeout_ms: int = 500, max_records: int | None = None) -> list[Delivery]:
        """The next decoded events (possibly none), in partition order; bad records already dead-lettered."""
        batch = await self.raw.getmany(timeout_ms=timeout_ms, max_records=max_records)
        deliveries: list[Delivery] = []
        for records in batch.values():
            for record in records:
                outcome = decode_or_dead_letter(record, registry=self._registry, source_service=self._service)
                where = (record.topic, record.partition)
                if isinstance(outcome, DeadLetter):
                    if record.offset > self._read_up_to.get(where, -1):
                        await self._send_dead_letter(outcome)
                else:
                    deliveries.append(Delivery(outcome, RecordMeta.of(record)))
                self._read_up_to[where] = max(self._read_up_to.get(where, -1), record.offset)
        return deliveries

    async def __aiter__(self) -> AsyncIterator[Delivery]:
        while True:
            for delivery in await self.getmany():
                yield delivery

    async def commit(self) -> None:
        """Commit the positions of everything returned so far."""
        await self.raw.commit()

    async def _send_dead_letter(self, letter: DeadLetter) -> None:
        if self._dlq is None:
            raise RuntimeError("EventConsumer is not started")
        await self._dlq.send_and_wait(
            letter.topic, value=letter.value, key=letter.key, headers=letter.headers
        )
        counted = (letter.topic, letter.code)
        self.dead_letters[counted] = self.dead_letters.get(counted, 0) + 1
