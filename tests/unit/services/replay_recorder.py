"""A recorded log built in-process the way the shell and processor write it (no Kafka), for replay tests.

:class:`ServiceRun` runs a per-event service as :func:`services.common.shell.restore_and_process` does:
a restore of the restore topics up to their ends, then batches from the committed offsets, each
record offered to the live ``select`` (on its raw bytes), handled through the shell's own
:class:`~services.common.shell.Replayed` cache (and its once-per-batch ``flush``), every output stamped
with the headers :class:`~gangline.bus.processor.Processor` writes (positions, run, batch, restore).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from svc_helpers import T0

from gangline.bus import DeadLetter, DeadLetterOutputs, Outgoing, RecordMeta, Select
from gangline.bus.consumer import decode_or_dead_letter
from gangline.bus.positions import (
    BATCH_HEADER,
    INCARNATION_HEADER,
    INPUTS_HEADER,
    RESTORED_HEADER,
    RESUMED_HEADER,
    STARTED_HEADER,
    Partition,
    format_batch,
    format_positions,
    merged,
)
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode, dumps, encode
from gangline.replay.log import LogRecord
from services.common.shell import Decide, EndBatch, Replayed
from services.common.topics import TopicNames

TOPICS = TopicNames()
JOB_PARTITIONS = 3


@dataclass(frozen=True)
class RawRecord:
    """What ``select`` is given: the fields of a consumed record it reads."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


class Log:
    """The topics' partitions, a clock, and every record written (in write order)."""

    def __init__(self, topics: TopicNames = TOPICS) -> None:
        self.topics = topics
        self.records: list[LogRecord] = []
        self.ends: dict[Partition, int] = {}
        self.clock = T0

    def tick(self, ms: int = 7) -> datetime:
        self.clock += timedelta(milliseconds=ms)
        return self.clock

    def partitions_of(self, topic: str) -> int:
        t = self.topics
        return JOB_PARTITIONS if topic in (t.events, t.allocations, t.requests) else 1

    def append(
        self, topic: str, body: dict[str, Any], key: str, headers: dict[str, str] | None = None
    ) -> LogRecord:
        partition = zlib.crc32(key.encode()) % self.partitions_of(topic)
        offset = self.ends.get((topic, partition), 0)
        self.ends[(topic, partition)] = offset + 1
        self.tick()
        record = LogRecord(
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            envelope=body,
            headers=headers or {},
            timestamp_ms=int(self.clock.timestamp() * 1000),
        )
        self.records.append(record)
        return record

    def produce(self, topic: str, envelope: Envelope, headers: dict[str, str] | None = None) -> LogRecord:
        return self.append(topic, json.loads(encode(envelope)), envelope.subject, headers)

    def partition(self, tp: Partition) -> list[LogRecord]:
        return sorted((r for r in self.records if (r.topic, r.partition) == tp), key=lambda r: r.offset)


def raw(record: LogRecord) -> RawRecord:
    return RawRecord(
        record.topic,
        record.partition,
        record.offset,
        record.timestamp_ms or 0,
        (record.key or "").encode(),
        dumps(record.envelope),
    )


def envelope_of(record: LogRecord) -> Envelope | None:
    try:
        return decode(dumps(record.envelope))
    except DecodeError:
        return None


@dataclass
class Wiring:
    """What a service's ``wiring.main`` hands the shell, with ``now`` read from the log's clock."""

    live_topics: tuple[str, ...]
    restore_topics: tuple[str, ...]
    new_state: Callable[[datetime], Any]
    restore: Callable[[Any, Envelope], None]
    decide: Callable[[Any, Callable[[], datetime]], Decide]
    end_batch: Callable[[Any, Callable[[], datetime]], EndBatch] | None = None
    select: Callable[[Any], Select | None] = lambda state: None
    restore_select: Callable[[Any], Select | None] | None = None
    dead_letter_outputs: Callable[[Any, Callable[[], datetime]], DeadLetterOutputs] | None = None


@dataclass
class ServiceRun:
    """A service's runs over one :class:`Log`: restarts, batches, and the outputs they wrote."""

    log: Log
    wiring: Wiring
    rng: random.Random = field(default_factory=lambda: random.Random(5))
    committed: dict[Partition, int] = field(default_factory=dict)
    runs: int = 0

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        """A (re)start: a fresh state restored from the log as it stands, a new incarnation."""
        self.runs += 1
        self.incarnation = f"run-{self.runs}"
        self.started = self.log.tick()
        w = self.wiring
        self.state = w.new_state(self.started)
        restore_select = (w.restore_select or w.select)(self.state)
        self.restored: dict[Partition, int] = {}
        for topic in w.restore_topics:
            for p in range(self.log.partitions_of(topic)):
                tp = (topic, p)
                self.restored[tp] = self.log.ends.get(tp, 0)
                for r in self.log.partition(tp):
                    if restore_select is not None and not restore_select(raw(r)):
                        continue
                    envelope = envelope_of(r)
                    if envelope is not None:
                        w.restore(self.state, envelope)
        self.folded = dict(self.restored)
        self.resumed = {
            (t, p): self.committed.get((t, p), 0)
            for t in w.live_topics
            for p in range(self.log.partitions_of(t))
        }
        self.announced = False
        self.replayed = Replayed(
            w.decide(self.state, self.log.tick),
            end_batch=w.end_batch(self.state, self.log.tick) if w.end_batch is not None else None,
        )

    def poll(self, *, max_per_partition: int | None = None, shuffle: bool = True) -> list[Outgoing]:
        """One batch of what is not consumed yet (partitions in a random order); its outputs written."""
        w = self.wiring
        select = w.select(self.state)
        batch: list[tuple[Partition, list[LogRecord]]] = []
        for topic in w.live_topics:
            for p in range(self.log.partitions_of(topic)):
                tp = (topic, p)
                records = [r for r in self.log.partition(tp) if r.offset >= self.committed.get(tp, 0)]
                if max_per_partition is not None:
                    records = records[:max_per_partition]
                if records:
                    batch.append((tp, records))
        if shuffle:
            self.rng.shuffle(batch)
        if not batch:
            return []
        folded = merged(self.folded, {tp: records[-1].offset + 1 for tp, records in batch})
        headers = {
            INPUTS_HEADER: format_positions(folded),
            INCARNATION_HEADER: self.incarnation,
            BATCH_HEADER: format_batch([(t, p, rs[0].offset, rs[-1].offset + 1) for (t, p), rs in batch]),
        }
        if not self.announced:
            headers[RESTORED_HEADER] = format_positions(self.restored)
            headers[RESUMED_HEADER] = format_positions(self.resumed)
            headers[STARTED_HEADER] = self.started.isoformat()
        outputs: list[Outgoing] = []
        given: list[Envelope] = []
        for _, records in batch:
            for r in records:
                if select is not None and not select(raw(r)):
                    continue
                outcome = decode_or_dead_letter(raw(r), registry=None, source_service="test")
                if isinstance(outcome, DeadLetter):
                    if w.dead_letter_outputs is not None:
                        outputs += w.dead_letter_outputs(self.state, self.log.tick)(outcome)
                    continue
                envelope = outcome
                given.append(envelope)
                meta = RecordMeta(r.topic, r.partition, r.offset, None, r.timestamp_ms or 0, ())
                for topic, out in self.replayed(envelope, meta):
                    outputs.append((topic, out.model_copy(update={"causationid": envelope.id})))
        if given:
            outputs += list(self.replayed.flush(given))
        for topic, out in outputs:
            self.log.produce(topic, out, headers)
        self.folded = folded
        for tp, records in batch:
            self.committed[tp] = records[-1].offset + 1
        self.announced = self.announced or bool(outputs)
        return outputs

    def drain(self, **options: Any) -> list[Outgoing]:
        """Poll until nothing is left to consume (its own outputs included)."""
        out: list[Outgoing] = []
        while True:
            left = any(
                r.offset >= self.committed.get((r.topic, r.partition), 0)
                for r in self.log.records
                if r.topic in self.wiring.live_topics
            )
            if not left:
                return out
            out += self.poll(**options)


def outputs_of(records: Sequence[LogRecord], source: str) -> list[LogRecord]:
    return [r for r in records if r.envelope.get("source") == source]


def tampered(
    records: list[LogRecord], target: LogRecord, edit: Callable[[dict[str, Any]], None]
) -> list[LogRecord]:
    out = []
    for r in records:
        if r is target:
            envelope: dict[str, Any] = json.loads(json.dumps(r.envelope))
            edit(envelope)
            r = LogRecord(r.topic, r.partition, r.offset, r.key, envelope, r.headers, r.timestamp_ms)
        out.append(r)
    return out
