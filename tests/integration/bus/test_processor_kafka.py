"""The transactional processor against the real broker: exactly once, DLQ, abort and retry."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Sequence

import pytest
from bus_kafka_helpers import (
    NOW,
    REGISTRY,
    Ping,
    Pong,
    envelopes,
    ping,
    pong_handler,
    produce_pings,
    produce_raw,
    read_all,
)

from gangline.bus import (
    DLQ_CODE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_SOURCE_SERVICE,
    DLQ_TOPIC,
    BatchInfo,
    Outgoing,
    Processor,
    ProcessorSettings,
    RecordMeta,
    header,
)
from gangline.events.base import Envelope, make_envelope
from gangline.events.codec import encode

pytestmark = pytest.mark.kafka


def _settings(bootstrap: str, topic: str, **overrides: object) -> ProcessorSettings:
    group = f"g-{uuid.uuid4().hex[:8]}"
    values: dict[str, object] = {
        "bootstrap_servers": bootstrap,
        "service": "pong",
        "instance_id": "pong-0",
        "group_id": group,
        "input_topics": (topic,),
        "max_batch_records": 5,
        "poll_timeout_ms": 100,
        "retry_backoff_s": 0.05,
        "session_timeout_ms": 6_000,
        "heartbeat_interval_ms": 1_000,
    }
    values.update(overrides)
    return ProcessorSettings.model_validate(values)


async def _run_until(
    processor: Processor, bootstrap: str, topic: str, count: int, partitions: int = 1
) -> list[Envelope]:
    """Run the processor until ``count`` outputs are committed on ``topic``; then stop it cleanly."""
    task = asyncio.create_task(processor.run())
    try:
        records = await read_all(bootstrap, topic, at_least=count, partitions_count=partitions, timeout_s=30)
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)
    return envelopes(records)


async def test_round_trip_with_abort_and_retry_is_exactly_once(kafka_bootstrap: str, topic_factory) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=2)
    sink = await topic_factory(partitions=2)
    await produce_pings(kafka_bootstrap, source.name, range(20))
    failures = iter([True, False, True])  # fail the 1st and 3rd commit attempts after the outputs were sent

    async def crash_before_commit(batch: BatchInfo) -> None:
        if next(failures, False):
            assert batch.outputs > 0
            raise ConnectionError("simulated crash between produce and commit")

    processor = Processor(
        _settings(kafka_bootstrap, source.name),
        pong_handler(sink.name),
        registry=REGISTRY,
        before_commit=crash_before_commit,
    )
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 20, partitions=2)

    assert processor.stats.batches_aborted == 2
    assert sorted(env.data.n for env in outputs if isinstance(env.data, Pong)) == list(range(20))
    assert all(env.causationid == f"ping-{env.data.n}" for env in outputs if isinstance(env.data, Pong))
    # The aborted attempts did write: a read_uncommitted reader sees their records too.
    uncommitted = await read_all(
        kafka_bootstrap, sink.name, isolation="read_uncommitted", at_least=21, partitions_count=2
    )
    assert len(uncommitted) > 20
    # And the committed offsets moved past every input: a restart has nothing left to do.
    rerun = Processor(
        _settings(kafka_bootstrap, source.name, group_id=processor._settings.group_id),
        pong_handler(sink.name),
        registry=REGISTRY,
    )
    task = asyncio.create_task(rerun.run())
    await asyncio.wait_for(rerun.started.wait(), timeout=15)
    await asyncio.sleep(0.5)
    rerun.request_stop()
    await asyncio.wait_for(task, timeout=15)
    assert rerun.stats.events_handled == 0


async def test_bad_messages_go_to_the_dlq_and_the_loop_keeps_going(
    kafka_bootstrap: str, topic_factory
) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    invalid = json.loads(encode(ping(1)))
    invalid["data"]["n"] = -1
    values = [
        encode(ping(0)),
        b"\x00\x01 not json at all",
        json.dumps(invalid).encode(),
        encode(ping(3)),
        encode(ping(4)),
    ]
    await produce_raw(kafka_bootstrap, source.name, values, key=b"job-x")

    processor = Processor(_settings(kafka_bootstrap, source.name), pong_handler(sink.name), registry=REGISTRY)
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 3)

    assert [env.data.n for env in outputs if isinstance(env.data, Pong)] == [0, 3, 4]
    letters = await read_all(kafka_bootstrap, source.dead_letter or "", at_least=2)
    assert [letter.value for letter in letters] == values[1:3]
    assert all(letter.key == b"job-x" for letter in letters)
    garbage, schema_invalid = letters
    assert header(garbage.headers, DLQ_CODE) == b"malformed_message"
    assert header(schema_invalid.headers, DLQ_CODE) == b"schema_violation"
    assert b"data.n" in (header(schema_invalid.headers, DLQ_REASON) or b"")
    assert header(garbage.headers, DLQ_TOPIC) == source.name.encode()
    assert header(garbage.headers, DLQ_PARTITION) == b"0"
    assert [header(letter.headers, DLQ_OFFSET) for letter in letters] == [b"1", b"2"]
    assert header(garbage.headers, DLQ_SOURCE_SERVICE) == b"pong"
    assert processor.stats.dead_lettered == 2


async def test_a_poison_message_is_retried_then_dead_lettered(kafka_bootstrap: str, topic_factory) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    await produce_pings(kafka_bootstrap, source.name, range(6))
    calls: Counter[int] = Counter()
    inner = pong_handler(sink.name)

    def handler(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        assert isinstance(envelope.data, Ping)
        calls[envelope.data.n] += 1
        if envelope.data.n == 2:
            raise ValueError("cannot place ping 2")
        return inner(envelope, meta)

    processor = Processor(
        _settings(kafka_bootstrap, source.name, max_handler_attempts=3), handler, registry=REGISTRY
    )
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 5)

    assert sorted(env.data.n for env in outputs if isinstance(env.data, Pong)) == [0, 1, 3, 4, 5]
    assert calls[2] == 3
    (letter,) = await read_all(kafka_bootstrap, source.dead_letter or "", at_least=1)
    assert header(letter.headers, DLQ_CODE) == b"handler_failed"
    assert b"ValueError: cannot place ping 2" in (header(letter.headers, DLQ_REASON) or b"")
    assert letter.value == encode(ping(2))


async def test_a_record_the_handler_refuses_is_dead_lettered_next_to_its_outputs(
    kafka_bootstrap: str, topic_factory
) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    await produce_pings(kafka_bootstrap, source.name, range(4))

    def refused_odd(envelope: Envelope, outputs: Sequence[Outgoing]) -> tuple[str, str] | None:
        # judged by what the handler returned, as placement judges a registration by its node.rejected
        assert isinstance(envelope.data, Ping) and len(outputs) == 1
        return ("odd_ping", f"ping {envelope.data.n} is odd") if envelope.data.n % 2 else None

    processor = Processor(
        _settings(kafka_bootstrap, source.name),
        pong_handler(sink.name),
        registry=REGISTRY,
        refusal=refused_odd,
    )
    outputs = await _run_until(processor, kafka_bootstrap, sink.name, 4)

    assert [env.data.n for env in outputs if isinstance(env.data, Pong)] == [0, 1, 2, 3]  # outputs go out
    letters = await read_all(kafka_bootstrap, source.dead_letter or "", at_least=2)
    assert [letter.value for letter in letters] == [encode(ping(1)), encode(ping(3))]
    assert [header(letter.headers, DLQ_CODE) for letter in letters] == [b"odd_ping"] * 2
    assert header(letters[0].headers, DLQ_REASON) == b"ping 1 is odd"
    assert [header(letter.headers, DLQ_OFFSET) for letter in letters] == [b"1", b"3"]
    assert processor.stats.dead_lettered == 2


async def test_a_flush_decides_once_per_batch_in_the_same_transaction(
    kafka_bootstrap: str, topic_factory
) -> None:  # type: ignore[no-untyped-def]
    source = await topic_factory(partitions=1)
    sink = await topic_factory(partitions=1)
    await produce_pings(kafka_bootstrap, source.name, range(12))
    failures = iter([True, False, True])
    calls: list[list[str]] = []

    async def crash_before_commit(batch: BatchInfo) -> None:
        if next(failures, False):
            raise ConnectionError("simulated crash between produce and commit")

    def summary(given: Sequence[Envelope]) -> Sequence[Outgoing]:
        # One event per batch naming how many pings it folded (n), caused by the batch's last event.
        calls.append([e.id for e in given])
        last = given[-1]
        pong = Pong(job_id="summary", n=len(given))
        out = make_envelope(
            pong, event_id=f"sum-{last.id}", source="test/pong", time=NOW, causationid=last.id
        )
        return [(sink.name, out)]

    processor = Processor(
        _settings(kafka_bootstrap, source.name, max_batch_records=4),
        lambda envelope, meta: [],
        registry=REGISTRY,
        before_commit=crash_before_commit,
        flush=summary,
    )
    task = asyncio.create_task(processor.run())
    try:
        deadline = asyncio.get_running_loop().time() + 30
        committed: list[Envelope] = []
        while sum(e.data.n for e in committed if isinstance(e.data, Pong)) < 12:
            assert asyncio.get_running_loop().time() < deadline, "the summaries never covered every ping"
            committed = envelopes(await read_all(kafka_bootstrap, sink.name, at_least=1, timeout_s=30))
    finally:
        processor.request_stop()
        await asyncio.wait_for(task, timeout=30)

    assert processor.stats.batches_aborted == 2
    # Aborted batches' summaries are invisible: the committed ones count every ping exactly once.
    assert sum(e.data.n for e in committed if isinstance(e.data, Pong)) == 12
    assert all(1 <= e.data.n <= 4 for e in committed if isinstance(e.data, Pong))
    assert all(e.causationid is not None and e.id == f"sum-{e.causationid}" for e in committed)
    assert all(ids for ids in calls) and len(calls) == processor.stats.batches_committed + 2
