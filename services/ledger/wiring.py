"""The ledger's loop: poll a batch, write it and its projections in one database transaction, then
commit the Kafka offsets.

The database commit comes first, so a crash between the two redelivers the batch, and the ledger's
idempotency by event id makes the second delivery a no-op: at-least-once delivery with an
exactly-once effect. Undecodable records never reach us (the consumer dead-letters them). A batch
that fails is retried from its first offsets; when it keeps failing, its events are written one
by one and each event that still fails (with the database reachable) is dead-lettered with the
error as its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from prometheus_client.core import Metric

from gangline.bus import Delivery, EventConsumer, dead_letter
from gangline.bus.lag import lag_by_topic, position_now
from gangline.bus.records import HANDLER_FAILED
from gangline.bus.security import client_options
from gangline.events.codec import encode
from gangline.events.registry import Registry, default_registry
from gangline.telemetry import semconv
from gangline.telemetry.metrics import counter, gauge
from gangline.telemetry.propagation import context_from_traceparent, extract_context
from gangline.telemetry.tracing import get_tracer
from services.ledger.settings import LedgerSettings
from services.ledger.store import project_batch

log = logging.getLogger(__name__)

SERVICE = "ledger"

AfterDbCommit = Callable[[Sequence[Delivery]], Awaitable[None]]
"""Awaited after the database commit, before the offset commit: a seam for crash tests."""


_UNAVAILABLE = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError)


@dataclass
class LedgerStats:
    batches: int = 0
    events_seen: int = 0
    events_new: int = 0
    retries: int = 0
    dead_lettered: int = 0
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    """Per ``(dead-letter topic, code)`` (for the metrics)."""


@dataclass(frozen=True, slots=True)
class _Record:
    """A delivery seen as a Kafka record again, to dead-letter it (re-encoded: the codec is canonical)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]

    @classmethod
    def of(cls, delivery: Delivery) -> _Record:
        meta = delivery.meta
        return cls(
            meta.topic,
            meta.partition,
            meta.offset,
            meta.timestamp_ms,
            meta.key,
            encode(delivery.envelope),
            meta.headers,
        )


class Ledger:
    """Projects the public topics into PostgreSQL until :meth:`request_stop` or cancellation."""

    def __init__(
        self,
        settings: LedgerSettings,
        pool: asyncpg.Pool,
        *,
        registry: Registry | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        after_db_commit: AfterDbCommit | None = None,
        max_attempts: int = 3,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._registry = registry or default_registry()
        self._tracer = get_tracer(tracer_provider)
        self._after_db_commit = after_db_commit
        self._max_attempts = max_attempts
        self._retry_backoff_s = retry_backoff_s
        self._stop = asyncio.Event()
        self.stats = LedgerStats()
        self.started = asyncio.Event()
        """Set once the consumer has its first partitions."""
        self._consumer: EventConsumer | None = None
        self._committed: dict[TopicPartition, int] = {}
        """The group's committed offset per assigned partition, as this ledger knows it (for the lag)."""

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        settings = self._settings
        consumer = EventConsumer(
            settings.kafka_bootstrap,
            settings.input_topics,
            service=SERVICE,
            group_id=settings.group_id,
            registry=self._registry,
            isolation_level="read_committed",
        )
        dlq = AIOKafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap, **client_options(), enable_idempotence=True
        )
        await dlq.start()
        try:
            async with consumer:
                self._consumer = consumer
                log.info("ledger started", extra={"topics": list(settings.input_topics)})
                attempt = 0
                while not self._stop.is_set():
                    deliveries = await consumer.getmany(
                        timeout_ms=settings.poll_timeout_ms, max_records=settings.max_batch_records
                    )
                    if consumer.raw.assignment():
                        self.started.set()
                    await self._note_committed(consumer)
                    if not deliveries:
                        await self._commit_moved(consumer)
                        continue
                    try:
                        if attempt + 1 < self._max_attempts:
                            await self._write(deliveries)
                        else:
                            await self._write_one_by_one(deliveries, dlq)
                    except Exception as error:
                        attempt += 1
                        self.stats.retries += 1
                        log.warning("batch not written (attempt %d): %s", attempt, error)
                        _rewind(consumer, deliveries)
                        await asyncio.sleep(self._retry_backoff_s)
                        continue
                    attempt = 0
                    if self._after_db_commit is not None:
                        await self._after_db_commit(deliveries)
                    try:
                        await self._commit(consumer)
                    except KafkaError as error:
                        # E.g. a rebalance took the partitions: their new owner re-reads the batch,
                        # which the ledger already holds, so the second write is a no-op.
                        log.warning("offsets not committed: %s", error)
        finally:
            self._consumer = None
            await dlq.stop()
            log.info("ledger stopped", extra={"stats": vars(self.stats)})

    def dead_letters(self) -> dict[tuple[str, str], int]:
        """Per ``(dead-letter topic, code)``: the events the ledger could not store, and the records its
        consumer could not read (this run's consumer)."""
        out = dict(self.stats.dead_letters)
        if self._consumer is not None:
            for key, count in self._consumer.dead_letters.items():
                out[key] = out.get(key, 0) + count
        return out

    def consumer_lag(self) -> dict[str, int]:
        """Records of each topic past the group's committed offsets, counted as the processor counts them
        (:meth:`gangline.bus.Processor.consumer_lag`). Empty while not consuming."""
        consumer = self._consumer
        if consumer is None:
            return {}
        return lag_by_topic(consumer.raw, self._committed, self._settings.input_topics)

    async def _note_committed(self, consumer: EventConsumer) -> None:
        """Read the committed offset of each partition newly assigned (once; then the ledger keeps it)."""
        assigned = consumer.raw.assignment()
        for tp in list(self._committed):
            if tp not in assigned:
                del self._committed[tp]
        for tp in assigned - self._committed.keys():
            with contextlib.suppress(KafkaError, TimeoutError):
                committed = await asyncio.wait_for(consumer.raw.committed(tp), 5)
                self._committed[tp] = committed or 0

    async def _commit(self, consumer: EventConsumer) -> None:
        """Commit the consumer's positions: past every transaction marker it stepped over (KAFKA-6607)."""
        found = {tp: position_now(consumer.raw, tp) for tp in consumer.raw.assignment()}
        positions = {tp: position for tp, position in found.items() if position is not None}
        if positions:
            await consumer.raw.commit(positions)
            self._committed.update(positions)

    async def _commit_moved(self, consumer: EventConsumer) -> None:
        """After a poll that returned nothing: commit a position that moved past the committed offset (a
        fetch that held only transaction markers), so lag reads 0 once caught up."""
        moved = False
        for tp in consumer.raw.assignment():
            position = position_now(consumer.raw, tp)
            moved = moved or (
                position is not None and tp in self._committed and position > self._committed[tp]
            )
        if moved:
            try:
                await self._commit(consumer)
            except KafkaError as error:
                log.warning("offsets not committed: %s", error)

    async def _write(self, deliveries: Sequence[Delivery]) -> None:
        spans = [self._span(d) for d in deliveries]
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                new = await project_batch(
                    conn, deliveries, self._registry, record_heartbeats=self._settings.record_heartbeats
                )
        finally:
            for span in spans:
                span.end()
        self.stats.batches += 1
        self.stats.events_seen += len(deliveries)
        self.stats.events_new += new

    async def _write_one_by_one(self, deliveries: Sequence[Delivery], dlq: AIOKafkaProducer) -> None:
        for delivery in deliveries:
            try:
                await self._write([delivery])
            except _UNAVAILABLE:
                raise  # the database is away: retry later, blame no event
            except Exception as error:
                # A batch of one failed on its content: this event is the poison.
                letter = dead_letter(
                    _Record.of(delivery),
                    code=HANDLER_FAILED,
                    reason=f"the ledger cannot store it: {type(error).__name__}: {error}",
                    source_service=SERVICE,
                )
                await dlq.send_and_wait(
                    letter.topic, value=letter.value, key=letter.key, headers=letter.headers
                )
                self.stats.dead_lettered += 1
                counted = (letter.topic, letter.code)
                self.stats.dead_letters[counted] = self.stats.dead_letters.get(counted, 0) + 1
                log.error(
                    "dead-lettered an event the ledger cannot store", extra={"event_id": delivery.envelope.id}
                )

    def _span(self, delivery: Delivery) -> Span:
        envelope, meta = delivery.envelope, delivery.meta
        context = extract_context(meta.headers)
        if not trace.get_current_span(context).get_span_context().is_valid:
            context = context_from_traceparent(envelope.traceparent)
        span: Span = self._tracer.start_span(
            f"process {meta.topic}",
            context=context,
            kind=SpanKind.CONSUMER,
            attributes={
                semconv.MESSAGING_SYSTEM: semconv.KAFKA,
                semconv.MESSAGING_OPERATION_TYPE: "process",
                semconv.MESSAGING_OPERATION_NAME: "process",
                semconv.MESSAGING_DESTINATION_NAME: meta.topic,
                semconv.MESSAGING_DESTINATION_PARTITION_ID: str(meta.partition),
                semconv.MESSAGING_KAFKA_OFFSET: meta.offset,
                semconv.MESSAGING_CONSUMER_GROUP_NAME: self._settings.group_id,
                semconv.MESSAGING_MESSAGE_ID: envelope.id,
                semconv.EVENT_TYPE: envelope.type,
                semconv.EVENT_SUBJECT: envelope.subject,
            },
        )
        return span


def _rewind(consumer: EventConsumer, deliveries: Sequence[Delivery]) -> None:
    first: dict[TopicPartition, int] = {}
    for d in deliveries:
        tp = TopicPartition(d.meta.topic, d.meta.partition)
        first[tp] = min(first.get(tp, d.meta.offset), d.meta.offset)
    for tp, offset in first.items():
        with contextlib.suppress(Exception):  # a partition revoked meanwhile restarts from its commit
            consumer.raw.seek(tp, offset)


def ledger_figures(ledger: Ledger) -> list[Metric]:
    """The ledger's lag and dead letters, as the decision services serve theirs."""
    lag = gauge("gangline_consumer_lag_records")
    for topic, records in sorted(ledger.consumer_lag().items()):
        lag.add_metric([SERVICE, topic], records)
    letters = counter("gangline_dead_letters_total")
    for (topic, code), count in sorted(ledger.dead_letters().items()):
        letters.add_metric([topic, code], count)
    return [lag, letters]
