"""`LogSource` over Kafka: every committed record of the topics, from the beginning (I/O).

The log is read as it stands when reading starts: the end offset of every partition is captured
first (with `read_committed`, the last stable offset), each partition is read from its beginning
until its position reaches that offset, and nothing that arrives later is read. Aborted
transactions are skipped by the broker, as every consumer of the log sees it. No consumer group is
joined and no offset is committed: reading the log leaves no trace on the broker.

Values are kept as JSON, headers as UTF-8 text: verification needs the bytes as written, not the
typed events, so a tampered record is read like any other and named by `verify_chain`. A record
that is not a UTF-8 JSON object (a producer's garbage on `jobs.requests`, which admission copied to
the dead-letter topic) is no log record: it is skipped and counted in `KafkaSource.skipped`, by
topic, with its position in `KafkaSource.unreadable` (`to_log_record` alone raises `LogFormatError`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from gangline.bus.security import client_options
from gangline.events.codec import MAX_DEPTH, too_deep
from gangline.events.topics import NODES_HEARTBEATS, PUBLIC_TOPICS
from gangline.replay.log import LogFormatError, LogRecord, record_from_json

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TOPICS = tuple(t for t in PUBLIC_TOPICS if t != NODES_HEARTBEATS)
"""What replay reads when no topic is named: the decision topics (heartbeats expire and decide nothing)."""


def default_bootstrap() -> str:
    """`GANGLINE_KAFKA_BOOTSTRAP`, or the local broker."""
    return os.environ.get("GANGLINE_KAFKA_BOOTSTRAP") or DEFAULT_BOOTSTRAP


def to_log_record(msg: ConsumerRecord[bytes, bytes]) -> LogRecord:
    """A consumed message as a `LogRecord` (see module docstring)."""
    where = f"{msg.topic}[{msg.partition}]@{msg.offset}"
    if msg.value is not None and too_deep(msg.value):
        raise LogFormatError(f"{where}: not a JSON record this log reads (nested more than {MAX_DEPTH} deep)")
    try:
        envelope = json.loads(msg.value) if msg.value is not None else None
        headers = {k: v.decode("utf-8") for k, v in msg.headers or ()}
        key = msg.key.decode("utf-8") if msg.key is not None else None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LogFormatError(f"{where}: not a UTF-8 JSON record ({e})") from None
    obj = {
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "key": key,
        "headers": headers,
        "envelope": envelope,
        "timestamp_ms": msg.timestamp,
    }
    return record_from_json(obj, where)


class KafkaSource:
    """The recorded log on a Kafka cluster (see module docstring)."""

    def __init__(self, bootstrap: str | None = None, *, timeout_s: float = 60.0) -> None:
        self.bootstrap = bootstrap or default_bootstrap()
        self.timeout_s = timeout_s
        self.skipped: dict[str, int] = {}
        """Records of the last read that are not JSON objects, per topic (see module docstring)."""
        self.unreadable: list[str] = []
        """Where those records are (`topic[partition]@offset`) and why, the first 100."""

    def records(self, topics: Sequence[str] | None = None) -> list[LogRecord]:
        """`fetch` for synchronous callers (the CLI); not from inside a running event loop."""
        return asyncio.run(self.fetch(topics))

    async def fetch(self, topics: Sequence[str] | None = None) -> list[LogRecord]:
        """Every committed record of `topics` (default `DEFAULT_TOPICS`) up to the end at the start.

        Records come per topic (in the order asked), then per partition, in offset order. A topic
        the cluster lacks is a `LookupError`, a broker that cannot be reached a `ConnectionError`,
        not reaching the captured end within `timeout_s` a `TimeoutError`.
        """
        names = list(dict.fromkeys(topics if topics is not None else DEFAULT_TOPICS))
        self.skipped, self.unreadable = {}, []
        consumer: AIOKafkaConsumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            **client_options(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        )
        try:
            await consumer.start()
        except KafkaError as e:
            raise ConnectionError(f"cannot read the log from Kafka at {self.bootstrap}: {e}") from e
        try:
            return await asyncio.wait_for(self._read(consumer, names), self.timeout_s)
        except KafkaError as e:
            raise ConnectionError(f"reading the log from Kafka at {self.bootstrap}: {e}") from e
        finally:
            await consumer.stop()

    async def _read(self, consumer: AIOKafkaConsumer, names: list[str]) -> list[LogRecord]:
        parts = await _partitions(self.bootstrap, names)
        tps = [TopicPartition(name, p) for name in names for p in parts[name]]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        got: dict[TopicPartition, list[LogRecord]] = {tp: [] for tp in tps}
        left = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while left:
            batch = await consumer.getmany(*left, timeout_ms=500)
            for tp, msgs in batch.items():
                end = ends[tp]
                for m in msgs:
                    if m.offset < end:
                        self._keep(got[tp], m)
            for tp in list(left):
                if await consumer.position(tp) >= ends[tp]:
                    left.discard(tp)
        return [r for tp in tps for r in got[tp]]

    def _keep(self, into: list[LogRecord], msg: ConsumerRecord[bytes, bytes]) -> None:
        try:
            into.append(to_log_record(msg))
        except LogFormatError as e:
            self.skipped[msg.topic] = self.skipped.get(msg.topic, 0) + 1
            if len(self.unreadable) < 100:
                self.unreadable.append(str(e))


async def _partitions(bootstrap: str, topics: list[str]) -> dict[str, list[int]]:
    """Each topic's partitions; a topic the cluster lacks is a `LookupError`."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options())
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    out: dict[str, list[int]] = {}
    for t in described:
        if t["error_code"] != 0 or not t["partitions"]:
            raise LookupError(f"topic {t['topic']} does not exist on {bootstrap}")
        out[t["topic"]] = sorted(p["partition"] for p in t["partitions"])
    return out
