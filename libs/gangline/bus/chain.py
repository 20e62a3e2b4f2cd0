"""Writing the hash chain of the chained topics (``allocations.log``): the producer's side.

:mod:`gangline.events.chain` defines the chain (three headers per record, one chain per
``(topic, partition, envelope source)``) and verifies it. A :class:`ChainStamper` is what both
the transactional :class:`~gangline.bus.Processor` and the plain
:class:`~gangline.bus.EventProducer` hand to :func:`~gangline.bus.producer.send_envelope`; for a
topic it chains, the record gets its headers and an explicit partition. The design, simplest first:

* **Partition before hash.** A chain is per partition, so the partition must be known when the
  headers are made: it is computed the way Kafka's default partitioner does (murmur2 of the key
  over the partition count, :func:`partition_for`) and passed to ``send(partition=...)``, so the
  record lands exactly where it would have without the chain.
* **Heads in memory.** One :class:`~gangline.events.chain.ChainWriter` per chain. Stamping and
  queueing a record happen under one lock, so concurrent senders cannot queue records in another
  order than their hashes link.
* **Recovery by reading the tail.** Heads come from the log itself: before the first stamp on a
  topic, :meth:`ChainStamper.refresh` reads each of its partitions (``read_committed``) from where
  it last stopped (the beginning, the first time) up to the last stable offset and keeps the last
  chained record of every source. Aborted records are never read, and the headers of the last committed record
  of a chain are all a writer needs to continue it. Only a record that continues its chain (seq and prev
  follow the head, the content matches the hash) becomes the head: a forged one is passed over.
* **Transactions.** :meth:`mark` notes the heads when a transaction begins, :meth:`rollback` puts
  them back when it aborts: a retried batch re-stamps from the committed heads.
* **One writer per chain at a time.** Two live writers with the same source on one partition would
  fork the chain (``verify_chain`` reports it). The processor catches its heads up after every
  rebalance (:meth:`ChainStamper.invalidate`), as it may take over from another replica of its
  service; the plain producer re-reads a topic after a failed send (the record may or may not be
  in the log).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2

from gangline.bus.security import KafkaSecurity, client_options
from gangline.events.base import JsonObject
from gangline.events.chain import GENESIS, HASH_HEADER, PREV_HEADER, SEQ_HEADER, ChainWriter, chain_hash
from gangline.events.codec import too_deep

ChainKey = tuple[str, int, str]
"""``(topic, partition, envelope source)``: one chain."""


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


@dataclass(frozen=True, slots=True)
class Stamp:
    """Where a chained record goes and the chain headers it carries."""

    partition: int
    headers: tuple[tuple[str, bytes], ...]


class ChainStamper:
    """The heads of every chain on ``topics``, stamped onto records as they are queued.

    The first :meth:`stamp` on a topic (and the first after :meth:`invalidate`) reads the topic
    first. Not shared between producers: each holds its own.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: Iterable[str],
        *,
        request_timeout_ms: int = 40_000,
        security: KafkaSecurity | None = None,
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._security = security
        self._request_timeout_ms = request_timeout_ms
        self.topics = frozenset(topics)
        self.lock = asyncio.Lock()
        """Held from :meth:`stamp` until the record is queued on the producer."""
        self._heads: dict[ChainKey, ChainWriter] = {}
        self._partitions: dict[str, int] = {}
        self._read_to: dict[TopicPartition, int] = {}
        self._fresh: set[str] = set()
        self._marked: dict[ChainKey, tuple[int, str]] | None = None

    def chains(self, topic: str) -> bool:
        return topic in self.topics

    def heads(self) -> dict[ChainKey, tuple[int, str]]:
        """Each chain → (next seq, last hash)."""
        return {k: (w.seq, w.prev) for k, w in self._heads.items()}

    # -- transactions --------------------------------------------------------------------

    def mark(self) -> None:
        """Remember the heads (a transaction begins)."""
        self._marked = self.heads()

    def rollback(self) -> None:
        """Back to the heads at :meth:`mark` (the transaction aborted); nothing to do without a mark."""
        if self._marked is None:
            return
        self._heads = {k: ChainWriter(seq=seq, prev=prev) for k, (seq, prev) in self._marked.items()}
        self._marked = None

    def invalidate(self) -> None:
        """Another writer may have extended our chains: catch up with the log before the next stamp.

        Call it only with nothing in flight (between transactions).
        """
        self._fresh.clear()

    def resume(
        self, heads: Mapping[ChainKey, tuple[int, str]], read_to: Mapping[tuple[str, int], int]
    ) -> None:
        """Start from ``heads`` as they stood with the log read up to ``read_to`` (a snapshot's), instead of
        reading the chained topics from the beginning: the first stamp reads only what follows.

        Records after ``read_to`` that the heads already count (this writer's own, written with the
        snapshot) are passed over as not continuing them; what follows them continues them.
        """
        self._heads = {k: ChainWriter(seq=seq, prev=prev) for k, (seq, prev) in heads.items()}
        self._read_to = {
            TopicPartition(topic, partition): offset
            for (topic, partition), offset in read_to.items()
            if topic in self.topics
        }
        self._fresh.clear()

    def stale(self) -> list[str]:
        """The chained topics whose heads are not caught up with the log yet (read before the next stamp)."""
        return sorted(self.topics - self._fresh)

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic``: the next stamp on it re-reads it from the beginning."""
        self._fresh.discard(topic)
        self._partitions.pop(topic, None)
        self._heads = {k: w for k, w in self._heads.items() if k[0] != topic}
        self._read_to = {tp: o for tp, o in self._read_to.items() if tp.topic != topic}

    # -- stamping ------------------------------------------------------------------------

    async def stamp(
        self,
        topic: str,
        key: bytes,
        envelope: JsonObject | bytes,
        *,
        partition: int | None = None,
        source: str | None = None,
    ) -> Stamp:
        """The partition and headers of the next record of ``envelope``'s chain; advances the head.

        ``envelope``: the record's JSON object, or its canonical bytes (the codec's, hashed as they are:
        no parse and dump again per record) with its ``source``.
        ``partition``: the record's partition when the writer chose it (a pool's); None: the key's.

        Call with :attr:`lock` held, and queue the record before releasing it.
        """
        if topic not in self._fresh:
            # Safe inside a transaction: none of its records is on this topic yet.
            await self.refresh([topic])
        if partition is None:
            partition = partition_for(key, self._partitions[topic])
        if source is None and not isinstance(envelope, bytes):
            found = envelope.get("source")
            source = found if isinstance(found, str) else None
        chain = (topic, partition, source if source is not None else "?")
        writer = self._heads.setdefault(chain, ChainWriter())
        headers = writer.headers_for(envelope)
        return Stamp(partition, tuple((k, v.encode()) for k, v in headers.items()))

    # -- recovery ------------------------------------------------------------------------

    async def refresh(self, topics: Iterable[str] | None = None) -> None:
        """Catch the heads up with the committed log of ``topics`` (default: all chained topics).

        Only call it when this writer has nothing in flight on those topics (no open transaction
        with records on them, no send not yet acknowledged): the heads become the log's.
        """
        wanted = sorted(self.topics if topics is None else set(topics))
        if not wanted:
            return
        counts = await _partition_counts(self._bootstrap_servers, wanted, self._security)
        consumer = AIOKafkaConsumer(
            **client_options(self._security),
            bootstrap_servers=self._bootstrap_servers,
            enable_auto_commit=False,
            isolation_level="read_committed",
            request_timeout_ms=self._request_timeout_ms,
            # What is read is in the log already; a long poll would hold up the offset requests behind it.
            fetch_max_wait_ms=20,
        )
        await consumer.start()
        try:
            tps: list[TopicPartition] = []
            for topic in wanted:
                self._partitions[topic] = counts[topic]
                tps += [TopicPartition(topic, p) for p in range(counts[topic])]
            consumer.assign(tps)
            ends: Mapping[TopicPartition, int] = await consumer.end_offsets(tps)
            todo = {}
            for tp in tps:
                start = self._read_to.get(tp, 0)
                if start < ends[tp]:
                    consumer.seek(tp, start)
                    todo[tp] = ends[tp]
                else:
                    self._read_to[tp] = ends[tp]
            last: dict[ChainKey, dict[str, str]] = {}
            known = self.heads()
            while todo:
                batch = await consumer.getmany(*todo, timeout_ms=500, max_records=5000)
                for tp, records in batch.items():
                    for record in records:
                        _note(last, tp, record.headers, record.value, known)
                for tp in list(todo):
                    # Transaction markers and aborted records move the position without a record.
                    position = await consumer.position(tp)
                    if position >= todo[tp]:
                        self._read_to[tp] = position
                        del todo[tp]
            for chain, headers in last.items():
                self._heads[chain] = ChainWriter.resume(headers)
            self._fresh.update(wanted)
        finally:
            await consumer.stop()


async def _partition_counts(
    bootstrap_servers: str, topics: list[str], security: KafkaSecurity | None
) -> dict[str, int]:
    admin = AIOKafkaAdminClient(**client_options(security), bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    counts: dict[str, int] = {}
    for t in described:
        if t["error_code"] != 0 or not t["partitions"]:
            raise RuntimeError(f"cannot chain {t['topic']!r}: the topic does not exist")
        counts[t["topic"]] = len(t["partitions"])
    return counts


def _note(
    last: dict[ChainKey, dict[str, str]],
    tp: TopicPartition,
    raw_headers: Iterable[tuple[str, bytes]],
    value: bytes | None,
    known: Mapping[ChainKey, tuple[int, str]] | None = None,
) -> None:
    """Keep the record's chain headers as its chain's head if it continues the chain, checked.

    ``last`` holds the heads noted so far in this read; ``known``, each chain's (next seq, last hash)
    before it. A record whose headers are malformed (``gangline-chain-seq: not-a-number``), whose seq or
    prev does not follow the head, or whose content does not match its hash is not the head: anyone
    who could write the topic could write it, and the writer must not continue (fork) its chain from it.
    """
    headers = {k: v.decode(errors="replace") for k, v in raw_headers}
    if SEQ_HEADER not in headers or HASH_HEADER not in headers or PREV_HEADER not in headers or not value:
        return
    if too_deep(value):  # a forged record: json.loads would raise RecursionError
        return
    try:
        envelope = json.loads(value)
    except (ValueError, RecursionError):
        return
    if not isinstance(envelope, dict):
        return
    source = envelope.get("source")
    chain = (tp.topic, tp.partition, source if isinstance(source, str) else "?")
    seq_text = headers[SEQ_HEADER]
    if not (seq_text.isascii() and seq_text.isdigit()):
        return
    head = last.get(chain)
    if head is not None:
        expected = (int(head[SEQ_HEADER]) + 1, head[HASH_HEADER])
    else:
        expected = (known or {}).get(chain, (0, GENESIS))
    seq = int(seq_text)
    if (seq, headers[PREV_HEADER]) != expected:
        return
    try:
        if chain_hash(headers[PREV_HEADER], seq, envelope) != headers[HASH_HEADER]:
            return
    except ValueError:  # prev is not hex
        return
    last[chain] = headers
