"""Typed producer: envelopes in, CloudEvents JSON on Kafka out, trace context in the headers.

The producer is idempotent (``enable_idempotence``: acks=all, no duplicates on retry). Each
publish opens a PRODUCER span, child of the current span, and writes that span's W3C
``traceparent`` both into the Kafka headers and into the envelope's ``traceparent`` attribute,
so a consumer finds the producer span as its parent whether it reads headers or the body.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gangline.bus.chain import ChainStamper
from gangline.bus.pools import PartitionOf, by_key
from gangline.bus.security import KafkaSecurity, client_options
from gangline.bus.trust import WriterSigner, default_signer
from gangline.events.base import Envelope
from gangline.events.codec import encode
from gangline.telemetry import semconv
from gangline.telemetry.propagation import traceparent_of, with_trace_headers
from gangline.telemetry.tracing import get_tracer


def stamped(envelope: Envelope) -> Envelope:
    """``envelope`` with the current span's traceparent (unchanged when no span is recording)."""
    traceparent = traceparent_of()
    if traceparent is None or traceparent == envelope.traceparent:
        return envelope
    return envelope.model_copy(update={"traceparent": traceparent})


def send_span_attributes(topic: str, envelope: Envelope) -> dict[str, str]:
    return {
        semconv.MESSAGING_SYSTEM: semconv.KAFKA,
        semconv.MESSAGING_OPERATION_TYPE: "send",
        semconv.MESSAGING_OPERATION_NAME: "send",
        semconv.MESSAGING_DESTINATION_NAME: topic,
        semconv.MESSAGING_MESSAGE_ID: envelope.id,
        semconv.MESSAGING_KAFKA_MESSAGE_KEY: envelope.subject,
        semconv.EVENT_TYPE: envelope.type,
        semconv.EVENT_SUBJECT: envelope.subject,
    }


async def send_envelope(
    producer: AIOKafkaProducer,
    tracer: trace.Tracer,
    topic: str,
    envelope: Envelope,
    *,
    key: str | None = None,
    headers: Sequence[tuple[str, bytes]] = (),
    chain: ChainStamper | None = None,
    partition: int | None = None,
    signer: WriterSigner | Literal["environment"] | None = "environment",
) -> Any:
    """Queue one envelope on ``producer`` inside a PRODUCER span; returns aiokafka's delivery future.

    Shared by :class:`EventProducer` and the transactional processor (whose producer is in a
    transaction when this is called). When ``chain`` chains ``topic`` the record gets its chain
    headers and the partition the default partitioner would pick (:mod:`gangline.bus.chain`). When the
    environment gives this process a writer key, the record is signed (:mod:`gangline.bus.trust`).
    ``partition``: where the record goes (a pool's partition, :mod:`gangline.bus.pools`); None: the key's.
    ``signer``: the writer key to sign with, when the caller looked it up once (a processor: not three
    environment reads per record); by default the environment's (:func:`~gangline.bus.trust.default_signer`).
    """
    with tracer.start_as_current_span(
        f"send {topic}", kind=SpanKind.PRODUCER, attributes=send_span_attributes(topic, envelope)
    ):
        envelope = stamped(envelope)
        record_key = (key if key is not None else envelope.subject).encode()
        value = encode(envelope)
        if isinstance(signer, str):  # "environment"
            signer = default_signer()
        if signer is not None:
            headers = [*headers, *signer.headers(topic, record_key, value)]
        if chain is None or not chain.chains(topic):
            return await producer.send(
                topic, value=value, key=record_key, partition=partition, headers=with_trace_headers(headers)
            )
        async with chain.lock:
            # The codec's bytes are the canonical form the chain hashes: no parse and dump again.
            stamp = await chain.stamp(topic, record_key, value, partition=partition, source=envelope.source)
            return await producer.send(
                topic,
                value=value,
                key=record_key,
                partition=stamp.partition,
                headers=with_trace_headers([*headers, *stamp.headers]),
            )


class EventProducer:
    """Publishes envelopes to Kafka; use ``async with EventProducer(...) as producer``."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        linger_ms: int = 0,
        request_timeout_ms: int = 40_000,
        chained_topics: Iterable[str] = (),
        security: KafkaSecurity | None = None,
        partition_of: PartitionOf | None = None,
    ) -> None:
        """``chained_topics``: topics whose records carry the hash chain (:mod:`gangline.bus.chain`);
        ``security``: credentials (None: the ``GANGLINE_KAFKA_*`` environment); ``partition_of``: where
        a record goes (a node agent's pool's partition, :mod:`gangline.bus.pools`; None: by its key)."""
        self._partition_of: PartitionOf = partition_of or by_key
        self._bootstrap_servers = bootstrap_servers
        self._security = security
        chained = tuple(chained_topics)
        self._chain = (
            ChainStamper(bootstrap_servers, chained, request_timeout_ms=request_timeout_ms, security=security)
            if chained
            else None
        )
        self._client_id = client_id
        self._linger_ms = linger_ms
        self._request_timeout_ms = request_timeout_ms
        self._tracer = get_tracer(tracer_provider)
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        producer = AIOKafkaProducer(
            **client_options(self._security),
            bootstrap_servers=self._bootstrap_servers,
            client_id=self._client_id,
            enable_idempotence=True,
            linger_ms=self._linger_ms,
            request_timeout_ms=self._request_timeout_ms,
        )
        await producer.start()
        self._producer = producer

    async def stop(self) -> None:
        """Flush what is queued and close the connections."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def chain(self) -> ChainStamper | None:
        """The chain stamper, for :func:`send_envelope` on :attr:`raw` (None: nothing chained)."""
        return self._chain

    @property
    def raw(self) -> AIOKafkaProducer:
        """The underlying aiokafka producer (started); for sending bytes the codec did not make."""
        if self._producer is None:
            raise RuntimeError("EventProducer is not started")
        return self._producer

    async def publish(
        self,
        topic: str,
        envelope: Envelope,
        *,
        key: str | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> RecordMetadata:
        """Send one envelope and wait until the broker has it (acks=all).

        ``key`` defaults to ``envelope.subject`` (the job or node id), which keeps one job's
        events in one partition, in order. ``partition``: where it goes (a pool's); None: the
        producer's ``partition_of``, else the key's.
        """
        chain = self._chain
        future = await send_envelope(
            self.raw,
            self._tracer,
            topic,
            envelope,
            key=key,
            headers=headers,
            chain=chain,
            partition=partition if partition is not None else self._partition_of(topic, envelope),
        )
        try:
            metadata: RecordMetadata = await future
        except Exception:
            if chain is not None and chain.chains(topic):
                # The record may or may not be in the log: re-read the chain's tail before the next one.
                chain.forget(topic)
            raise
        return metadata

    async def publish_many(
        self, items: Sequence[tuple[str, Envelope]]
    ) -> list[RecordMetadata | BaseException]:
        """Send ``(topic, envelope)`` pairs in order, then wait until the broker has each (acks=all).

        One round trip for the lot instead of one per envelope: every record is queued before the
        first acknowledgement is awaited (the idempotent producer keeps each partition's order). Each
        pair's outcome is returned in order: its metadata, or the error it failed with (the others
        are still sent). Records queued after a failed one on a chained topic re-read the chain's tail.
        """
        chain = self._chain
        pending: list[Any] = []
        for topic, envelope in items:
            try:
                partition = self._partition_of(topic, envelope)
                pending.append(
                    await send_envelope(
                        self.raw, self._tracer, topic, envelope, chain=chain, partition=partition
                    )
                )
            except Exception as err:
                if chain is not None and chain.chains(topic):
                    chain.forget(topic)
                pending.append(err)
        outcomes: list[RecordMetadata | BaseException] = []
        for (topic, _), future in zip(items, pending, strict=True):
            if isinstance(future, BaseException):
                outcomes.append(future)
                continue
            try:
                outcomes.append(await future)
            except Exception as err:
                if chain is not None and chain.chains(topic):
                    chain.forget(topic)
                outcomes.append(err)
        return outcomes
