"""Trace context survives a hop through Kafka: producer span -> headers -> processor span -> output."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from bus_kafka_helpers import REGISTRY, Ping, Pong, envelopes, ping, pong_handler, read_all
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gangline.bus import EventProducer, Outgoing, Processor, ProcessorSettings, RecordMeta
from gangline.events.base import Envelope
from gangline.telemetry import span_context_of
from gangline.telemetry.light import LightTracer

pytestmark = pytest.mark.kafka


async def test_the_consumer_span_is_a_child_of_the_producer_span(kafka_bootstrap: str, topic_factory) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async with EventProducer(kafka_bootstrap, tracer_provider=provider) as producer:
        with provider.get_tracer("test").start_as_current_span("api request"):
            await producer.publish(source.name, ping(7))

    settings = ProcessorSettings(
        bootstrap_servers=kafka_bootstrap,
        service="pong",
        instance_id="pong-0",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        input_topics=(source.name,),
        poll_timeout_ms=100,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
    )
    processor = Processor(settings, pong_handler(sink.name), registry=REGISTRY, tracer_provider=provider)
    task = asyncio.create_task(processor.run())
    try:
        (output,) = await read_all(kafka_bootstrap, sink.name, at_least=1)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)

    spans = exporter.get_finished_spans()
    (request,) = [s for s in spans if s.name == "api request"]
    (publish,) = [s for s in spans if s.name == f"send {source.name}"]
    (process,) = [s for s in spans if s.name == f"process {source.name}"]
    (forward,) = [s for s in spans if s.name == f"send {sink.name}"]
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (publish, process, forward)} == {trace_id}
    assert publish.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
    assert publish.parent is not None and publish.parent.span_id == request.context.span_id
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert process.parent.is_remote
    assert forward.parent is not None and forward.parent.span_id == process.context.span_id
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.destination.name"] == source.name
    assert attributes["messaging.destination.partition.id"] == "0"
    assert attributes["messaging.kafka.offset"] == 0
    assert attributes["gangline.event.type"] == "gangline.test.ping.v1"
    assert attributes["gangline.event.subject"] == "job-1"

    # The output record carries the same trace, in its headers and in its envelope.
    carried = span_context_of(output.headers)
    assert (carried.trace_id, carried.span_id) == (trace_id, forward.context.span_id)
    (envelope,) = envelopes([output])
    assert isinstance(envelope.data, Pong)
    assert envelope.causationid == "ping-7"
    assert envelope.traceparent is not None
    assert span_context_of([("traceparent", envelope.traceparent.encode())]).trace_id == trace_id


class CountingLightTracer(LightTracer):
    """The light tracer, counting the spans started per name."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> trace.Span:
        self.started.append(name)
        return super().start_span(name, *args, **kwargs)


class CountingProvider(trace.TracerProvider):
    def __init__(self) -> None:
        self.tracer = CountingLightTracer()

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return self.tracer


async def test_with_the_light_tracer_only_a_record_with_outputs_gets_a_span_and_its_outputs_keep_the_trace(
    kafka_bootstrap: str,
    topic_factory,  # type: ignore[no-untyped-def]
) -> None:
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    provider = CountingProvider()
    async with EventProducer(kafka_bootstrap, tracer_provider=provider) as producer:
        for n in range(4):
            await producer.publish(source.name, ping(n))
    assert provider.tracer.started.count(f"send {source.name}") == 4
    answer = pong_handler(sink.name)

    def odd_only(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        assert isinstance(envelope.data, Ping)
        return answer(envelope, meta) if envelope.data.n % 2 else []

    settings = ProcessorSettings(
        bootstrap_servers=kafka_bootstrap,
        service="pong",
        instance_id="pong-0",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        input_topics=(source.name,),
        poll_timeout_ms=100,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
    )
    processor = Processor(settings, odd_only, registry=REGISTRY, tracer_provider=provider)
    task = asyncio.create_task(processor.run())
    try:
        outputs = await read_all(kafka_bootstrap, sink.name, at_least=2)
        inputs = await read_all(kafka_bootstrap, source.name, at_least=4)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)

    assert provider.tracer.started.count(f"process {source.name}") == 2  # pings 1 and 3, not 0 and 2
    assert provider.tracer.started.count(f"send {sink.name}") == 2
    by_job = {span_context_of(r.headers).trace_id: span_context_of(r.headers) for r in inputs}
    for output, envelope in zip(outputs, envelopes(outputs), strict=True):
        carried = span_context_of(output.headers)
        assert isinstance(envelope.data, Pong) and envelope.data.n % 2 == 1
        # The same trace as the ping it answers, under a span of its own.
        assert carried.trace_id in by_job and carried.span_id != by_job[carried.trace_id].span_id
