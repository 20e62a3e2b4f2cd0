"""Replay and export from the real broker: a hash-chained allocations log written to a per-test
topic is read back whole, exported, verified, and a forged record on the broker is named."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from scenarios.dsl import gpus

from gangline.bus.admin import TopicSpec
from gangline.bus.security import client_options
from gangline.core.model import JobId, QueueName
from gangline.events.base import JsonObject
from gangline.events.chain import ChainWriter
from gangline.events.codec import dumps
from gangline.replay.chain import verify_chain
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import LogRecord, read_jsonl
from gangline.replay.record import record_log
from gangline.sim.trace import TraceJob
from services.tools.cli import main

pytestmark = pytest.mark.kafka

TopicFactory = Callable[..., Awaitable[TopicSpec]]
PARTITIONS = 2


def _allocation_envelopes() -> list[JsonObject]:
    """The grants and releases of a small simulated history, as CloudEvents."""
    # Core nodes with wire-safe GPU ids: record_log writes each core GPU id on the wire as it is.
    nodes = [
        gpus(8, model="A100", memory_mib=81920, leaf=f"leaf-{i // 2}").build(f"n-{i:04d}") for i in range(3)
    ]
    shapes = [(1, 8), (2, 8), (1, 4), (1, 2), (3, 4), (1, 1), (2, 2), (1, 8)]
    jobs = [
        TraceJob(JobId(f"j{k}"), 10.0 * k, 25.0 + 7 * k, QueueName(f"q{k % 2}"), w, g)
        for k, (w, g) in enumerate(shapes)
    ]
    log = record_log(nodes, jobs)
    return [r.envelope for r in log if r.topic == "allocations.log"]


async def _write_chained(
    bootstrap: str, topic: str, envelopes: list[JsonObject], *, forge: int | None = None
) -> list[tuple[int, JsonObject, dict[str, str]]]:
    """Produce `envelopes`, one hash chain per partition (by job); record `forge` is altered after
    hashing, as a writer without the chain's key would. Returns (partition, envelope, headers) sent."""
    writers = [ChainWriter() for _ in range(PARTITIONS)]
    sent: list[tuple[int, JsonObject, dict[str, str]]] = []
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_options(), enable_idempotence=True)
    await producer.start()
    try:
        for k, env in enumerate(envelopes):
            job = str(env["subject"])
            part = sum(job.encode()) % PARTITIONS
            headers = writers[part].headers_for(env)
            body = json.loads(json.dumps(env))
            if k == forge:
                body["data"]["reason"] = (
                    "cancelled" if body["data"].get("reason") != "cancelled" else "failed"
                )
            await producer.send_and_wait(
                topic,
                dumps(body),
                key=job.encode(),
                partition=part,
                headers=[(h, v.encode()) for h, v in headers.items()],
            )
            sent.append((part, body, headers))
    finally:
        await producer.stop()
    return sent


async def test_the_log_on_kafka_reads_back_whole_exports_and_verifies(
    kafka_bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = (await topic_factory(partitions=PARTITIONS)).name
    envelopes = _allocation_envelopes()
    sent = await _write_chained(kafka_bootstrap, topic, envelopes)

    got = await KafkaSource(kafka_bootstrap).fetch([topic])

    # Per partition, in offset order, every record as written: envelope, key, chain headers.
    assert len(got) == len(sent)
    for part in range(PARTITIONS):
        mine = [r for r in got if r.partition == part]
        assert [r.offset for r in mine] == list(range(len(mine)))
        assert [(r.envelope, dict(r.headers)) for r in mine] == [(e, h) for p, e, h in sent if p == part]
        assert all(r.key == r.envelope["subject"] for r in mine)
    chain = verify_chain(got, topics=[topic])
    assert chain.ok, chain.problems
    assert chain.records == len(sent)
    assert len(chain.heads) == PARTITIONS

    out = tmp_path / "log.jsonl"
    argv = ["export", "--from", "kafka", "--bootstrap", kafka_bootstrap, "--topics", topic, "--out", str(out)]
    assert await asyncio.to_thread(main, argv) == 0
    exported = list(read_jsonl(out))
    assert exported == got
    assert verify_chain(exported, topics=[topic]).ok


async def test_a_forged_record_on_the_broker_is_named(
    kafka_bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = (await topic_factory(partitions=PARTITIONS)).name
    envelopes = _allocation_envelopes()
    forged = 5
    await _write_chained(kafka_bootstrap, topic, envelopes, forge=forged)
    out = tmp_path / "log.jsonl"
    argv = ["export", "--from", "kafka", "--bootstrap", kafka_bootstrap, "--topics", topic, "--out", str(out)]
    assert await asyncio.to_thread(main, argv) == 0
    records: list[LogRecord] = list(read_jsonl(out))

    chain = verify_chain(records, topics=[topic])
    bad = next(r for r in records if r.event_id == envelopes[forged]["id"])
    assert [(p.kind, p.where, p.event_id) for p in chain.problems] == [("tampered", bad.where, bad.event_id)]
    assert f"{topic}[{bad.partition}]@{bad.offset}" in chain.problems[0].message


async def test_each_read_sees_the_log_as_it_stands_and_unknown_topics_are_refused(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = (await topic_factory(partitions=PARTITIONS)).name
    envelopes = _allocation_envelopes()
    first, later = envelopes[:6], envelopes[6:]
    await _write_chained(kafka_bootstrap, topic, first)
    before = await KafkaSource(kafka_bootstrap).fetch([topic])
    assert sorted(r.event_id for r in before) == sorted(str(e["id"]) for e in first)
    await _write_chained(kafka_bootstrap, topic, later)
    after = await KafkaSource(kafka_bootstrap).fetch([topic])
    assert len(after) == len(first) + len(later)

    with pytest.raises(LookupError, match="does not exist"):
        await KafkaSource(kafka_bootstrap).fetch([f"{topic}-absent"])
