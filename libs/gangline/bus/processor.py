"""The transactional consume-process-produce loop every decision service runs.

For each batch polled from the input topics the processor

1. begins a Kafka transaction,
2. decodes each record; an undecodable one is copied to its dead-letter topic (inside the
   transaction), a decodable one is handed to the handler inside a CONSUMER span whose parent
   is the producer's span (from the record's W3C headers),
3. produces the handler's outputs, each stamped with ``causationid`` = the consumed event's id
   and the trace context of the consumer span,
4. adds the consumed offsets to the transaction (``send_offsets_to_transaction``) and commits. The
   offset of a partition whose polled records the batch ends is the consumer's position, past the
   transaction markers that follow them (:mod:`gangline.bus.lag`), so lag reads 0 once caught up.
   Offsets of a batch that published nothing are held back (``idle_commit_ms``); so are those of
   every batch when ``offsets_in_every_transaction`` is off (single-leader services whose state
   folds their own outputs: an input read again after a crash decides nothing again).

Records on ``settings.chained_topics`` carry the hash chain (:mod:`gangline.bus.chain`): the
heads are read from the committed log before the first stamp and after each rebalance, and put
back when a transaction aborts, so a retried batch re-stamps from the committed heads.

With ``inputs`` (:class:`InputRecording`, opt-in) every output record of a transaction also carries
where the state's inputs stood when it decided (:mod:`gangline.bus.positions`): the restored
offsets given at start, raised by every committed batch. A service that decides once per batch is
replayed from those headers. They also name what the batch consumed, in the order it was handled,
and (on the first transaction with outputs of a run) where the restore stopped, where the consumer
resumed and when the run began: a service that decides per event is replayed from those.

With ``snapshots`` (:class:`~gangline.bus.snapshots.SnapshotWriter`, opt-in; it needs ``inputs``) a
batch's transaction also carries a snapshot of the state when one is due: the state as that batch left
it, covering the input positions its outputs are stamped with, and the hash chains' heads. A processor
started from such a snapshot (``chain_resume``) goes on from those heads, reading the chained topics from
the snapshot's positions instead of from their beginning. They are not outputs: they neither
announce the run (the restore's headers) nor make a batch count as one that published.

Outputs, dead letters and offsets become visible together or not at all: downstream readers use
``isolation_level="read_committed"``, so a crash at any instant loses nothing and duplicates
nothing. On a failure the transaction is aborted and the batch is retried after a short backoff,
with the same records (a handler that decides once per batch decided on those:
:meth:`Processor._until_committed`); the consumer is rewound to the batch's first offsets (the last
committed ones) only when those retries stop without a commit. A record whose handler raises
``max_handler_attempts`` times is a poison message: it goes to the DLQ with the exception as its
reason and the loop moves on. A record the handler read but refused,
as its outputs say (``refusal``: e.g. a ``node.rejected`` about it), goes to the DLQ too, with the
handler's reason, next to those outputs.

A batch can also fail outside the handler: a decoder bug, an output or dead letter the broker
refuses (too large), the flush or the dead-letter outputs raising. A failure that blames the input
(not a lost connection, a timeout or another retriable broker error, which are retried for as long as
they last) is counted: after ``max_batch_attempts`` failed attempts of a batch its records are tried
one per transaction, so the good ones commit, and a record that fails alone ``max_batch_attempts``
times is dead-lettered (code ``output_too_large`` or ``processing_failed``, the error as its reason)
in a transaction of its own, with its offset, and skipped. The counts live in memory: a restart
counts again from zero, which bounds the retries per run, not per record's life.

Handlers may therefore be called more than once for the same event (once per attempt); they
must be free of side effects outside their return value, or idempotent by event id.

Zombie fencing. aiokafka has one transactional producer per client and sends
``TxnOffsetCommit`` v0, which carries no consumer-group generation (KIP-447 fencing is not
available), so fencing rests on the ``transactional_id`` alone. We use one producer per
service replica with ``transactional_id = <group_id>.<instance_id>``, ``instance_id`` stable
across restarts:

- a restarted replica (same instance id) fences its previous incarnation: ``InitProducerId``
  bumps the epoch and aborts whatever transaction the zombie left open, and the zombie's next
  transactional call fails with ``ProducerFenced``;
- across a rebalance, the revoke callback waits for the in-flight transaction to commit or
  abort before the partitions are released, and a batch polled across a rebalance is put back
  unhandled (read again from its first record, never before the committed offset or what this run
  already handled), so a live member never commits offsets of a partition it no longer owns; a
  partition given back to the same run resumes after what that run handled;
- what this does not cover is a replica that is cut off (stalled past the session timeout)
  and later resumes a transaction its successor under a different instance id already
  redid. ``static_membership`` (``group.instance.id`` = instance id) narrows that window: a
  replaced replica's partitions return to the same instance id, i.e. the same
  ``transactional_id``. Per-partition transactional ids (one producer per input partition)
  would close it fully at the cost of one producer per partition; not done here.
- services where one replica at a time decides behind a leader lock share one
  ``transactional_id`` per role (``ProcessorSettings.transactional_role``): the new leader's
  ``InitProducerId`` fences the cut-off old leader outright, whatever it was doing. Their processors
  join no consumer group (``ProcessorSettings.group_membership``): the lock says who consumes, so a
  new leader neither waits for a dead one's membership to expire nor shares the partitions with a
  zombie, and a long batch makes no rebalance.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    IllegalStateError,
    KafkaError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordTooLargeError,
    UnsupportedVersionError,
)
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from gangline.bus.chain import ChainKey, ChainStamper
from gangline.bus.consumer import decode_or_dead_letter
from gangline.bus.lag import lag_by_topic, position_now
from gangline.bus.pools import PartitionOf, by_key
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
from gangline.bus.producer import send_envelope
from gangline.bus.records import (
    HANDLER_FAILED,
    OUTPUT_TOO_LARGE,
    PROCESSING_FAILED,
    DeadLetter,
    KafkaRecord,
    RecordMeta,
    dead_letter,
)
from gangline.bus.security import client_options
from gangline.bus.settings import ProcessorSettings
from gangline.bus.snapshots import SnapshotWriter
from gangline.bus.trust import default_signer
from gangline.events.base import Envelope
from gangline.events.registry import Registry
from gangline.telemetry import semconv
from gangline.telemetry.light import LightTracer
from gangline.telemetry.propagation import context_from_traceparent, extract_context
from gangline.telemetry.tracing import get_tracer

log = logging.getLogger(__name__)

Outgoing: TypeAlias = tuple[str, Envelope]
"""``(topic, envelope)``: one event the handler wants published; the key is the envelope's subject."""

Handler: TypeAlias = Callable[[Envelope, RecordMeta], Sequence[Outgoing] | Awaitable[Sequence[Outgoing]]]
"""Takes one consumed event, returns the events it causes (sync or async)."""


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What a ``before_commit`` hook sees: the offsets about to be committed and the attempt number."""

    offsets: Mapping[TopicPartition, int]
    outputs: int
    attempt: int


DeadLetterOutputs: TypeAlias = Callable[[DeadLetter], Sequence[Outgoing]]
"""Events to publish, in the same transaction, about a record that was dead-lettered (e.g. a rejection)."""

Refusal: TypeAlias = Callable[[Envelope, Sequence[Outgoing]], tuple[str, str] | None]
"""Whether the handler refused the event it was given, judged by what it returned: ``(code, reason)`` to
copy the record to its dead-letter topic with (the outputs are published all the same), or None."""

Select: TypeAlias = Callable[[KafkaRecord], bool]
"""Whether a record is worth decoding; a record it refuses is skipped (its offset still commits)."""

Flush: TypeAlias = Callable[[Sequence[Envelope]], Sequence[Outgoing] | Awaitable[Sequence[Outgoing]]]
"""Called once per batch, after the handler, with the events it was given (in order, at least one).

In the same transaction; returns more events to publish. For services that fold each event and
decide once per batch (one scheduling cycle per poll, not one per record). Its outputs are sent as
they are: each envelope names its own ``causationid``; each is traced as a child of the consumed
event with the same subject (else of the batch's last). Like a handler it may be called again for
a retried batch.
"""

BeforeCommit: TypeAlias = Callable[[BatchInfo], Awaitable[None]]
"""Awaited after outputs and offsets are in the transaction, before the commit; raising aborts.

A seam for fault-injection tests (a crash between produce and commit); services leave it unset.
"""


@dataclass(frozen=True, slots=True)
class InputRecording:
    """Stamp each output with the input positions its batch decided on (see module docstring).

    ``incarnation`` names this run of the processor (new at every start); ``restored`` is where the
    state's restore from the log stopped, per ``(topic, partition)``: the positions start there.
    ``started``: when the run's state was created (stamped with ``restored`` until a transaction with
    outputs commits).
    """

    incarnation: str
    restored: Mapping[Partition, int] = field(default_factory=dict)
    started: datetime | None = None


@dataclass(frozen=True, slots=True)
class ChainResume:
    """Where the hash chains stood in the snapshot the state was loaded from (see ``ChainStamper.resume``)."""

    heads: Mapping[ChainKey, tuple[int, str]]
    read_to: Mapping[Partition, int]


class ProcessorFailed(Exception):
    """The transactional producer is unusable (fenced by a newer incarnation, or in a fatal state).

    The process should exit and be restarted; the restart fences whatever was left behind.
    """


@dataclass
class ProcessorStats:
    """Counters for logs, benchmarks and tests."""

    batches_committed: int = 0
    batches_aborted: int = 0
    events_handled: int = 0
    outputs_sent: int = 0
    dead_lettered: int = 0
    offsets_deferred: int = 0
    """Batches that published nothing and left their offsets to a later commit (``idle_commit_ms``)."""
    records_isolated: int = 0
    """Records tried in a transaction of their own because their batch kept failing."""
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    """Dead letters sent, per ``(dead-letter topic, code)`` (for the metrics)."""
    snapshots_written: int = 0
    """Snapshots of the state committed with a batch (``snapshots``)."""


class _HandlerFailed(Exception):
    """A handler raised; the batch is aborted and retried (counted against the record)."""


def transactional_producer(settings: ProcessorSettings) -> AIOKafkaProducer:
    """The processor's producer under ``settings``, not started (starting it fences every earlier producer
    of its transactional id, aborting what one left open)."""
    return AIOKafkaProducer(
        **client_options(settings.security),
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.service}-{settings.instance_id}",
        transactional_id=settings.transactional_id,
        transaction_timeout_ms=settings.transaction_timeout_ms,
        request_timeout_ms=settings.request_timeout_ms,
        retry_backoff_ms=settings.producer_retry_backoff_ms,
        enable_idempotence=True,
    )


class Processor:
    """Runs ``handler`` over the input topics, exactly once per committed record."""

    def __init__(
        self,
        settings: ProcessorSettings,
        handler: Handler,
        *,
        registry: Registry | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        before_commit: BeforeCommit | None = None,
        dead_letter_outputs: DeadLetterOutputs | None = None,
        select: Select | None = None,
        flush: Flush | None = None,
        inputs: InputRecording | None = None,
        refusal: Refusal | None = None,
        snapshots: SnapshotWriter | None = None,
        chain_resume: ChainResume | None = None,
        producer: AIOKafkaProducer | None = None,
        partition_of: PartitionOf | None = None,
    ) -> None:
        """``producer``: a :func:`transactional_producer` of these settings, started already (the one
        that fenced the predecessor before a restore): used instead of starting another; the processor
        stops it."""
        if snapshots is not None and inputs is None:
            raise ValueError("snapshots name the input positions they cover: they need input recording")
        self._settings = settings
        self._inputs = inputs
        self._snapshots = snapshots
        self._snapshot_sent = False
        """Whether the transaction in hand carries a snapshot (told to the writer if it aborts)."""
        self._folded: dict[Partition, int] = dict(inputs.restored) if inputs is not None else {}
        self._headers: tuple[tuple[str, bytes], ...] = ()
        self._pending_offsets: dict[TopicPartition, int] = {}
        """Offsets of committed batches not committed yet themselves (batches that published nothing,
        or every batch without ``offsets_in_every_transaction``; see ``idle_commit_ms``)."""
        self._handled: dict[TopicPartition, int] = {}
        """Per input partition: the offset after the last batch this run committed (outputs included)."""
        self._polled_last: dict[TopicPartition, int] = {}
        """Per input partition: the offset of the last record polled (see :meth:`_next_offset`)."""
        self._group_offsets: dict[TopicPartition, int] = {}
        """Per assigned input partition: the group's committed offset as this run knows it (for the lag)."""
        self._offsets_committed_at = 0.0
        self._run_announced = False
        """Whether a transaction carrying the restore's headers committed with outputs."""
        self._resumed: dict[Partition, int] = {}
        """Where this run resumed each input partition (its committed offset when first assigned)."""
        self._joining: AIOKafkaConsumer | None = None
        self._flush = flush
        self._handler = handler
        self._registry = registry
        self._tracer = get_tracer(tracer_provider)
        self._lazy_spans = isinstance(self._tracer, LightTracer)
        """Spans record nothing here (:mod:`gangline.telemetry.light`): a record gets one only when it has
        outputs to parent (its handler's own log lines then carry no trace id)."""
        self._signer = default_signer()
        """The environment's writer key, looked up once (not on every record sent)."""
        self._before_commit = before_commit
        self._dead_letter_outputs = dead_letter_outputs
        self._refusal = refusal
        self._select = select
        self._partition_of: PartitionOf = partition_of or by_key
        self._stop = asyncio.Event()
        self._batch_lock = asyncio.Lock()
        self._generation = 0
        self._attempts: dict[tuple[str, int, int], int] = {}
        self._batch_attempt = 0
        self._batch_failures = 0
        """Consecutive failed attempts of the batch in hand that blame its input (``max_batch_attempts``)."""
        self._isolate_until: dict[TopicPartition, int] = {}
        """Per partition: records before this offset go one per transaction (their batch kept failing)."""
        self._failures: dict[tuple[str, int, int], int] = {}
        """Per record tried alone: its failed attempts that blame it."""
        self._poison: dict[tuple[str, int, int], Exception] = {}
        """Records to dead-letter instead of handling, with the last error they failed on."""
        self._bare_poison: set[tuple[str, int, int]] = set()
        """Poison records whose dead letter is sent alone (with its dead-letter outputs it failed too)."""
        self._in_transaction = False
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._started_producer = producer
        self._chain = (
            ChainStamper(
                settings.bootstrap_servers,
                settings.chained_topics,
                request_timeout_ms=settings.request_timeout_ms,
                security=settings.security,
            )
            if settings.chained_topics
            else None
        )
        if self._chain is not None and chain_resume is not None:
            self._chain.resume(chain_resume.heads, chain_resume.read_to)
        self.stats = ProcessorStats()
        self.started = asyncio.Event()
        """Set once the clients are up and the consumer has its first assignment."""

    def request_stop(self) -> None:
        """Finish the batch in hand (commit it, or abort it on failure), then stop. Idempotent."""
        self._stop.set()

    async def run(self) -> None:
        """Consume, handle, produce and commit until :meth:`request_stop` or cancellation.

        Cancellation aborts the in-flight transaction (a commit already under way is finished),
        stops both clients and re-raises. Raises :class:`ProcessorFailed` when the producer is
        fenced or broken.
        """
        try:
            await self._start()
            consumer = self._consumer
            assert consumer is not None
            self._offsets_committed_at = asyncio.get_running_loop().time()
            while not self._stop.is_set():
                generation = self._generation
                batch = await consumer.getmany(
                    timeout_ms=self._settings.poll_timeout_ms, max_records=self._settings.max_batch_records
                )
                if not batch:
                    await self._step_over_markers(consumer, generation)
                    if self._pending_offsets and self._idle_commit_due():
                        async with self._batch_lock:
                            await self._commit_pending()
                    continue
                batch = await self._linger(consumer, batch)
                self._polled_last.update({tp: records[-1].offset for tp, records in batch.items() if records})
                async with self._batch_lock:
                    if generation != self._generation:
                        # A rebalance happened since the poll: the batch is not handled, so it is read
                        # again (it may have been fetched after the positions were reset).
                        await self._unread(consumer, batch)
                        continue
                    await self._process(batch)
            if self._pending_offsets:
                async with self._batch_lock:
                    await self._commit_pending()
        finally:
            await self._close()

    async def _linger(
        self, consumer: AIOKafkaConsumer, batch: dict[TopicPartition, list[Any]]
    ) -> dict[TopicPartition, list[Any]]:
        polled = sum(len(records) for records in batch.values())
        room = self._settings.max_batch_records - polled
        # One record alone (an idle cluster's job, a heartbeat) is handled at once; a poll that found several
        # has a burst under way, worth waiting for the rest of.
        if self._settings.linger_ms <= 0 or room <= 0 or polled < 2:
            return batch
        await asyncio.sleep(self._settings.linger_ms / 1000)
        more = await consumer.getmany(timeout_ms=0, max_records=room)
        for tp, records in more.items():
            batch.setdefault(tp, []).extend(records)
        return batch

    # -- lifecycle ---------------------------------------------------------------------------

    async def _start(self) -> None:
        settings = self._settings
        given, self._started_producer = self._started_producer, None
        producer = given if given is not None else transactional_producer(settings)
        consumer = AIOKafkaConsumer(
            **client_options(settings.security),
            bootstrap_servers=settings.bootstrap_servers,
            client_id=f"{settings.service}-{settings.instance_id}",
            group_id=settings.group_id,
            group_instance_id=settings.instance_id if settings.static_membership else None,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset=settings.auto_offset_reset,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            request_timeout_ms=settings.request_timeout_ms,
        )
        # Producer first: InitProducerId fences a previous incarnation before we read anything.
        if given is None:
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
        self._producer = producer
        self._joining = consumer  # the first assignment may come before start() returns
        if settings.group_membership:
            consumer.subscribe(list(settings.input_topics), listener=_Rebalance(self))
        try:
            await consumer.start()
            if not settings.group_membership:
                await self._assign_all(consumer)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        log.info(
            "processor started",
            extra={"transactional_id": settings.transactional_id, "topics": list(settings.input_topics)},
        )

    async def _assign_all(self, consumer: AIOKafkaConsumer) -> None:
        """Without group membership: every partition of the inputs (those ``input_partitions`` names, for
        a topic it names), from the group's committed offsets."""
        await consumer._client.force_metadata_update()
        assigned: list[TopicPartition] = []
        only = self._settings.input_partitions
        for topic in self._settings.input_topics:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise RuntimeError(f"input topic missing on the broker: {topic}")
            if topic in only:
                # A pool's processor reads only its pool's partitions (gangline.bus.pools).
                missing = set(only[topic]) - set(partitions)
                if missing:
                    raise RuntimeError(f"{topic} has no partition {sorted(missing)}: too few for the pools")
                partitions = set(only[topic])
            assigned += [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        committed = await self._committed_all(consumer, assigned)
        for tp, offset in committed.items():
            if offset is not None:
                consumer.seek(tp, offset)
        await self._on_assigned(assigned, committed)

    async def _close(self) -> None:
        producer, consumer = self._producer, self._consumer
        self._producer = self._consumer = None
        try:
            if producer is not None and self._in_transaction:
                await self._abort()
        finally:
            try:
                if consumer is not None:
                    await consumer.stop()
            finally:
                if producer is not None:
                    await producer.stop()
        log.info("processor stopped", extra={"stats": vars(self.stats)})

    async def _on_assigned(
        self, assigned: list[TopicPartition], committed: Mapping[TopicPartition, int | None] | None = None
    ) -> None:
        """Resume a partition this run had handled past its committed offset where it had got to; with
        input recording, note where this run resumes each partition first assigned to it (committed).

        Offsets held back (idle batches; every batch without ``offsets_in_every_transaction``) are not
        committed when a rebalance takes the partitions away. Given back to this run, a partition would
        restart at its committed offset, and a handler that remembers its outputs for retried batches
        (as the services' shell does) would publish the outputs of already committed inputs again; so
        this run goes on after what it committed instead. Another process taking the partitions over
        starts at the committed offset with a state rebuilt from the log, and decides nothing again.

        ``committed``: the group's committed offsets of ``assigned``, when the caller has read them already
        (else they are read here, all in one request).
        """
        consumer = self._consumer or self._joining
        if consumer is None:
            return
        if committed is None:
            committed = await self._committed_all(consumer, assigned)
        for tp in assigned:
            offset = committed.get(tp)
            if offset is not None:
                self._group_offsets[tp] = offset
        for tp in assigned:
            handled = self._handled.get(tp)
            if handled is not None:
                offset = committed.get(tp)
                if offset is None or offset < handled:
                    consumer.seek(tp, handled)
        if self._inputs is None:
            return
        for tp in assigned:
            key = (tp.topic, tp.partition)
            if key not in self._resumed:
                offset = committed.get(tp)
                if offset is not None:
                    self._resumed[key] = offset
                elif self._settings.auto_offset_reset == "earliest":
                    self._resumed[key] = 0

    async def _on_revoked(self) -> None:
        # Wait for the in-flight transaction, then invalidate batches polled under the old assignment.
        async with self._batch_lock:
            self._generation += 1
            self._attempts.clear()
            self._forget_failures()
            # Whoever owns these partitions next reads that input again: it published nothing, or (without
            # offsets_in_every_transaction) what it published is in the log, which a new owner's state folds.
            self._pending_offsets.clear()
            if self._chain is not None:
                # Another replica may extend our chains while it owns the partitions: catch up first.
                self._chain.invalidate()

    # -- one batch ---------------------------------------------------------------------------

    async def _process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        if not self._isolate_until:
            await self._until_committed(batch)
            return
        # The records of a batch that kept failing go one per transaction; what follows them, together.
        pending = {tp: list(records) for tp, records in batch.items()}
        for tp, records in batch.items():
            until = self._isolate_until.get(tp)
            if until is None:
                continue
            for record in records:
                if record.offset >= until:  # past them (or the log moved on without them)
                    del self._isolate_until[tp]
                    break
                self.stats.records_isolated += 1
                if not await self._attempt({tp: [record]}):
                    self._rewind({other: rest for other, rest in pending.items() if rest})
                    return
                pending[tp].pop(0)
                if record.offset + 1 >= until:
                    del self._isolate_until[tp]
                    break
        rest = {tp: records for tp, records in pending.items() if records}
        if rest:
            await self._attempt(rest)

    def _forget_failures(self) -> None:
        self._batch_failures = 0
        self._isolate_until.clear()
        self._failures.clear()
        self._poison.clear()
        self._bare_poison.clear()

    async def _until_committed(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Handle ``batch`` until its transaction commits, each retry with the same records.

        A handler that decides once per batch (``flush``) has decided on these records when an attempt
        aborts, and its state holds that decision: a retry of a different batch (a fresh poll may hold more
        records, or fewer) would publish a decision no replay of the committed batch makes. So the
        records polled are retried as they are, and only when the retries stop without a commit (a stop
        is requested, or the batch keeps failing and its records go one per transaction) is the consumer
        rewound for a fresh poll to read them again.
        """
        while not await self._attempt(batch, rewind=False):
            if self._stop.is_set() or self._isolate_until:
                self._rewind(batch)
                return

    async def _attempt(self, batch: dict[TopicPartition, list[Any]], *, rewind: bool = True) -> bool:
        """Handle ``batch`` in one transaction; False when it was aborted (and, with ``rewind``, rewound to
        be read again)."""
        self._batch_attempt += 1
        try:
            await self._transact(batch)
        except asyncio.CancelledError:
            if self._in_transaction:
                await self._abort()
            raise
        except ProcessorFailed:
            raise
        except Exception as error:
            if _is_fatal(self._producer, error):
                raise ProcessorFailed(f"the transactional producer is unusable: {error!r}") from error
            self.stats.batches_aborted += 1
            if self._in_transaction:
                await self._abort()
            if self._snapshot_sent and self._snapshots is not None:
                self._snapshots.aborted(error)
            if rewind:
                self._rewind(batch)
            log.warning(
                "batch aborted, retrying it: %s",
                error,
                exc_info=not isinstance(error, _HandlerFailed),
            )
            self._count_failure(batch, error)
            await asyncio.sleep(self._settings.retry_backoff_s)
            return False
        self._batch_attempt = 0
        self._batch_failures = 0
        return True

    def _count_failure(self, batch: dict[TopicPartition, list[Any]], error: Exception) -> None:
        """Count a failed attempt against its input, when the error blames the input (module docstring)."""
        if isinstance(error, _HandlerFailed) or not _blames_the_input(error):
            return
        records = [record for records in batch.values() for record in records]
        limit = self._settings.max_batch_attempts
        if len(records) == 1:
            record = records[0]
            key = (record.topic, record.partition, record.offset)
            if key in self._poison:
                self._bare_poison.add(key)  # even its dead letter failed: next time without its outputs
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            if failures >= limit:
                self._poison[key] = error
            return
        self._batch_failures += 1
        if self._batch_failures >= limit:
            self._batch_failures = 0
            self._isolate_until = {tp: records[-1].offset + 1 for tp, records in batch.items() if records}
            log.warning(
                "a batch failed %d times; trying its records one per transaction to find the bad one",
                limit,
                extra={"records": len(records)},
            )

    async def _transact(self, batch: dict[TopicPartition, list[Any]]) -> None:
        producer = self._producer
        assert producer is not None
        if self._chain is not None:
            self._chain.mark()
        await producer.begin_transaction()
        self._in_transaction = True
        self._snapshot_sent = False
        deliveries: list[asyncio.Future[Any]] = []
        offsets: dict[TopicPartition, int] = {}
        handled = 0
        folded = self._stamp_inputs(batch)
        given: list[Envelope] = []
        for tp, records in batch.items():
            for record in records:
                deliveries += await self._handle(producer, record, given)
                handled += 1
            offsets[tp] = self._next_offset(tp, records)
        if self._flush is not None and given:
            deliveries += await self._send_flushed(producer, given)
        snapshot = await self._send_snapshot(producer, folded, handled)
        self._snapshot_sent = bool(snapshot)
        # Offsets only move forward: this batch's positions over those still pending.
        to_commit = {**self._pending_offsets, **offsets}
        defer = (
            not deliveries or not self._settings.offsets_in_every_transaction
        ) and not self._idle_commit_due()
        if defer:
            await asyncio.gather(*deliveries, *snapshot)
        else:
            # The offsets join the transaction while its records are produced (AddOffsetsToTxn waits only
            # for AddPartitionsToTxn, not for the produce): one round trip fewer per batch. A failed
            # delivery aborts the transaction, offsets and all.
            await _all_of(
                *deliveries,
                *snapshot,
                producer.send_offsets_to_transaction(to_commit, self._settings.group_id),
            )
        if self._before_commit is not None:
            await self._before_commit(
                BatchInfo(offsets=dict(offsets), outputs=len(deliveries), attempt=self._batch_attempt)
            )
        await self._commit(producer)  # nothing sent and no offsets: ends locally, no round trip
        if defer:
            self._pending_offsets = to_commit
            self.stats.offsets_deferred += 1
        else:
            self._group_offsets.update(to_commit)
            self._pending_offsets = {}
            self._offsets_committed_at = asyncio.get_running_loop().time()
        self._folded = folded
        self._run_announced = self._run_announced or bool(deliveries)
        if self._snapshots is not None:
            self._snapshots.committed(bool(snapshot), handled)
            self.stats.snapshots_written += bool(snapshot)
        self.stats.batches_committed += 1
        self.stats.events_handled += handled
        self.stats.outputs_sent += len(deliveries)
        for tp, records in batch.items():
            self._handled[tp] = offsets[tp]
            for record in records:
                key = (tp.topic, tp.partition, record.offset)
                self._attempts.pop(key, None)
                if self._failures.pop(key, None) is not None:
                    self._poison.pop(key, None)
                    self._bare_poison.discard(key)

    def _next_offset(self, tp: TopicPartition, records: Sequence[Any]) -> int:
        """The offset to commit after ``records``: the consumer's position when they end what was polled of
        ``tp`` (so the commit steps over the transaction marker that follows them, and lag reads 0 once
        caught up: KAFKA-6607), else the offset after the last of them."""
        after = int(records[-1].offset) + 1
        consumer = self._consumer
        if consumer is None or self._polled_last.get(tp) != records[-1].offset:
            return after
        position = position_now(consumer, tp)
        return after if position is None else max(after, position)

    async def _step_over_markers(self, consumer: AIOKafkaConsumer, generation: int) -> None:
        """After a poll that returned nothing: a partition whose position moved past what this run handled
        (a fetch that held only transaction markers or aborted records) has that position to commit, as
        idle offsets do (``idle_commit_ms``)."""
        async with self._batch_lock:
            if generation != self._generation:
                return
            for tp, handled in list(self._handled.items()):
                position = position_now(consumer, tp)
                if position is not None and position > handled:
                    self._handled[tp] = self._pending_offsets[tp] = position

    def consumer_lag(self) -> dict[str, int]:
        """Records of each input topic past the group's committed offsets, as ``kafka-consumer-groups.sh``
        counts them: per assigned partition, its high watermark as of this consumer's latest fetch less
        the committed offset (0 once everything read is committed). Empty while not consuming."""
        consumer = self._consumer
        if consumer is None:
            return {}
        return lag_by_topic(consumer, self._group_offsets, self._settings.input_topics)

    def _idle_commit_due(self) -> bool:
        """Whether offsets held back by idle batches are old enough to commit on their own."""
        wait_s = self._settings.idle_commit_ms / 1000
        return asyncio.get_running_loop().time() - self._offsets_committed_at >= wait_s

    async def _commit_pending(self) -> None:
        """Commit the offsets of idle batches in a transaction of their own (nothing else in it)."""
        producer = self._producer
        if producer is None or not self._pending_offsets:
            return
        offsets = dict(self._pending_offsets)
        if self._chain is not None:
            self._chain.mark()  # nothing is stamped here: an abort must leave the heads as they are
        try:
            await producer.begin_transaction()
            self._in_transaction = True
            await producer.send_offsets_to_transaction(offsets, self._settings.group_id)
            await self._commit(producer)
        except asyncio.CancelledError:
            if self._in_transaction:
                await self._abort()
            raise
        except Exception as error:
            if _is_fatal(producer, error):
                raise ProcessorFailed(f"the transactional producer is unusable: {error!r}") from error
            if self._in_transaction:
                await self._abort()
            log.warning("committing idle offsets failed; kept for the next batch: %s", error)
            return
        self._group_offsets.update(offsets)
        self._pending_offsets = {}
        self._offsets_committed_at = asyncio.get_running_loop().time()

    def _stamp_inputs(self, batch: dict[TopicPartition, list[Any]]) -> dict[Partition, int]:
        """The input positions once this batch is folded; the headers every output of it carries."""
        if self._inputs is None:
            return self._folded
        folded = merged(
            self._folded, {(tp.topic, tp.partition): records[-1].offset + 1 for tp, records in batch.items()}
        )
        consumed = [
            (tp.topic, tp.partition, records[0].offset, records[-1].offset + 1)
            for tp, records in batch.items()
            if records
        ]
        headers = [
            (INPUTS_HEADER, format_positions(folded).encode()),
            (INCARNATION_HEADER, self._inputs.incarnation.encode()),
            (BATCH_HEADER, format_batch(consumed).encode()),
        ]
        if not self._run_announced:
            headers.append((RESTORED_HEADER, format_positions(self._inputs.restored).encode()))
            headers.append((RESUMED_HEADER, format_positions(self._resumed).encode()))
            if self._inputs.started is not None:
                headers.append((STARTED_HEADER, self._inputs.started.isoformat().encode()))
        self._headers = tuple(headers)
        return folded

    async def _handle(
        self, producer: AIOKafkaProducer, record: KafkaRecord, given: list[Envelope]
    ) -> list[asyncio.Future[Any]]:
        poison = self._poison.get((record.topic, record.partition, record.offset))
        if poison is not None:
            return await self._dead_letter_poison(producer, record, poison)
        if self._select is not None and not self._select(record):
            return []
        outcome = decode_or_dead_letter(
            record, registry=self._registry, source_service=self._settings.service
        )
        if isinstance(outcome, DeadLetter):
            log.warning(
                "dead-lettered an unreadable record",
                extra={"topic": record.topic, "partition": record.partition, "offset": record.offset},
            )
            sent = [await self._send_dead_letter(producer, outcome)]
            if self._dead_letter_outputs is not None:
                for topic, output in self._dead_letter_outputs(outcome):
                    sent.append(await self._send(producer, topic, output))
            return sent
        envelope = outcome
        meta = RecordMeta.of(record)
        if self._lazy_spans:
            # The light tracer records nothing: a span only gives the outputs their parent, so one is made
            # only for a record whose handler had some (most records are folded, deciding nothing).
            try:
                outputs = await self._call_handler(envelope, meta)
            except Exception as error:
                return [await self._after_handler_failure(producer, record, error)]
            given.append(envelope)
            refused = self._refusal(envelope, outputs) if self._refusal is not None else None
            if not outputs and refused is None:
                return []
            with self._tracer.start_as_current_span(
                f"process {record.topic}",
                context=self._parent_context(record, envelope),
                kind=SpanKind.CONSUMER,
            ):
                return await self._send_outputs(producer, record, envelope, outputs, refused)
        with self._tracer.start_as_current_span(
            f"process {record.topic}",
            context=self._parent_context(record, envelope),
            kind=SpanKind.CONSUMER,
            attributes=self._process_attributes(record, envelope),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                outputs = await self._call_handler(envelope, meta)
            except Exception as error:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                return [await self._after_handler_failure(producer, record, error)]
            given.append(envelope)
            refused = self._refusal(envelope, outputs) if self._refusal is not None else None
            return await self._send_outputs(producer, record, envelope, outputs, refused)

    async def _send_outputs(
        self,
        producer: AIOKafkaProducer,
        record: KafkaRecord,
        envelope: Envelope,
        outputs: Sequence[Outgoing],
        refused: tuple[str, str] | None,
    ) -> list[asyncio.Future[Any]]:
        """Send what the handler returned for ``envelope`` (each caused by it), and its dead letter when the
        handler refused it; inside the record's CONSUMER span."""
        deliveries = []
        for topic, output in outputs:
            caused = output.model_copy(update={"causationid": envelope.id})
            deliveries.append(await self._send(producer, topic, caused))
        if refused is not None:
            code, reason = refused
            letter = dead_letter(record, code=code, reason=reason, source_service=self._settings.service)
            deliveries.append(await self._send_dead_letter(producer, letter))
        return deliveries

    async def _send_flushed(
        self, producer: AIOKafkaProducer, given: Sequence[Envelope]
    ) -> list[asyncio.Future[Any]]:
        assert self._flush is not None
        result = self._flush(given)
        outputs = await result if inspect.isawaitable(result) else result
        by_subject = {envelope.subject: envelope for envelope in given}
        deliveries = []
        for topic, output in outputs:
            # Traced under the consumed event about the same subject (the job), else the batch's last.
            parent = by_subject.get(output.subject, given[-1])
            with self._tracer.start_as_current_span(
                "decide batch",
                context=context_from_traceparent(parent.traceparent),
                kind=SpanKind.INTERNAL,
                attributes={semconv.EVENT_TYPE: output.type, semconv.EVENT_SUBJECT: output.subject},
            ):
                deliveries.append(await self._send(producer, topic, output))
        return deliveries

    async def _send_snapshot(
        self, producer: AIOKafkaProducer, folded: Mapping[Partition, int], events: int
    ) -> list[asyncio.Future[Any]]:
        """The records of a snapshot of the state, when one is due, sent in the batch's transaction."""
        if self._snapshots is None or not self._snapshots.due(events):
            return []
        sent = []
        heads = {}
        if self._chain is not None:
            stale = self._chain.stale()
            if stale:
                # No record of this transaction is on a stale topic (a stamp would have caught it up), so
                # the heads can be read from the log now: a snapshot must carry them as they are.
                async with self._chain.lock:
                    await self._chain.refresh(stale)
            heads = self._chain.heads()
        for record in self._snapshots.records(folded, events, heads):
            future: asyncio.Future[Any] = await producer.send(
                self._snapshots.topic,
                value=record.value,
                key=record.key,
                headers=list(record.headers),
                partition=self._snapshots.partition,
            )
            sent.append(future)
        return sent

    async def _after_handler_failure(
        self, producer: AIOKafkaProducer, record: KafkaRecord, error: Exception
    ) -> asyncio.Future[Any]:
        key = (record.topic, record.partition, record.offset)
        attempts = self._attempts[key] = self._attempts.get(key, 0) + 1
        if attempts < self._settings.max_handler_attempts:
            raise _HandlerFailed(
                f"handler failed on {record.topic}[{record.partition}]@{record.offset} "
                f"(attempt {attempts} of {self._settings.max_handler_attempts}): "
                f"{type(error).__name__}: {error}"
            ) from error
        log.error(
            "handler keeps failing; dead-lettering the record",
            extra={"topic": record.topic, "partition": record.partition, "offset": record.offset},
            exc_info=error,
        )
        letter = dead_letter(
            record,
            code=HANDLER_FAILED,
            reason=f"the handler failed {attempts} times; last error: {type(error).__name__}: {error}",
            source_service=self._settings.service,
        )
        return await self._send_dead_letter(producer, letter)

    async def _dead_letter_poison(
        self, producer: AIOKafkaProducer, record: KafkaRecord, error: Exception
    ) -> list[asyncio.Future[Any]]:
        """Dead-letter a record that kept failing alone outside the handler, with what it causes when
        that can be built and sent (a rejection), else alone."""
        key = (record.topic, record.partition, record.offset)
        failures = self._failures.get(key, 0)
        log.error(
            "a record keeps failing outside the handler; dead-lettering it",
            extra={"topic": record.topic, "partition": record.partition, "offset": record.offset},
            exc_info=error,
        )
        letter = dead_letter(
            record,
            code=OUTPUT_TOO_LARGE if isinstance(error, _TOO_LARGE) else PROCESSING_FAILED,
            reason=f"processing it failed {failures} times; last error: {type(error).__name__}: {error}",
            source_service=self._settings.service,
        )
        sent = [await self._send_dead_letter(producer, letter)]
        if self._dead_letter_outputs is None or key in self._bare_poison:
            return sent
        try:
            outputs = list(self._dead_letter_outputs(letter))
        except Exception as failure:
            log.error("the outputs of a dead letter cannot be built; it goes alone", exc_info=failure)
            return sent
        for topic, output in outputs:
            sent.append(await self._send(producer, topic, output, routed=False))
        return sent

    async def _send(
        self, producer: AIOKafkaProducer, topic: str, output: Envelope, *, routed: bool = True
    ) -> asyncio.Future[Any]:
        """Queue one output in the transaction: the processor's headers, hash chain and writer key, on the
        partition ``partition_of`` gives it (``routed``; else the producer's partitioner's)."""
        future: asyncio.Future[Any] = await send_envelope(
            producer,
            self._tracer,
            topic,
            output,
            headers=self._headers,
            chain=self._chain,
            signer=self._signer,
            partition=self._partition_of(topic, output) if routed else None,
        )
        return future

    async def _send_dead_letter(self, producer: AIOKafkaProducer, letter: DeadLetter) -> asyncio.Future[Any]:
        self.stats.dead_lettered += 1
        counted = (letter.topic, letter.code)
        self.stats.dead_letters[counted] = self.stats.dead_letters.get(counted, 0) + 1
        future: asyncio.Future[Any] = await producer.send(
            letter.topic, value=letter.value, key=letter.key, headers=letter.headers
        )
        return future

    async def _call_handler(self, envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        result = self._handler(envelope, meta)
        if inspect.isawaitable(result):
            return await result
        return result

    async def _commit(self, producer: AIOKafkaProducer) -> None:
        # Once the commit is requested it cannot be aborted: see it through even when cancelled.
        commit = asyncio.ensure_future(producer.commit_transaction())
        try:
            await asyncio.shield(commit)
        except asyncio.CancelledError:
            await commit
            self._in_transaction = False
            raise
        self._in_transaction = False

    async def _abort(self) -> None:
        producer = self._producer
        assert producer is not None
        try:
            await asyncio.shield(producer.abort_transaction())
        except Exception as error:
            raise ProcessorFailed(f"cannot abort the transaction: {type(error).__name__}: {error}") from error
        finally:
            self._in_transaction = False
            if self._chain is not None:
                self._chain.rollback()

    async def _unread(self, consumer: AIOKafkaConsumer, batch: dict[TopicPartition, list[Any]]) -> None:
        """Put back a batch polled across a rebalance, on the partitions this run still holds: from its
        first record, but never before what is committed or what this run already handled."""
        assigned = consumer.assignment()
        for tp, records in batch.items():
            if tp not in assigned or not records:
                continue
            committed = await self._committed(consumer, tp)
            start = max(records[0].offset, committed or 0, self._handled.get(tp, 0))
            with contextlib.suppress(IllegalStateError):
                consumer.seek(tp, start)

    async def _committed_all(
        self, consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets of ``tps``, in one request (one round trip, not one per partition);
        None for a partition with none. Asked within a few seconds, as :meth:`_committed`; failing that,
        partition by partition."""
        try:
            found = await asyncio.wait_for(
                consumer._coordinator.fetch_committed_offsets(list(tps)),
                min(5.0, self._settings.request_timeout_ms / 1000),
            )
        except (KafkaError, TimeoutError) as error:
            log.warning("could not read the committed offsets in one request: %r", error)
            return {tp: await self._committed(consumer, tp) for tp in tps}
        out: dict[TopicPartition, int | None] = {}
        for tp in tps:
            meta = found.get(tp)
            out[tp] = meta.offset if meta is not None and meta.offset != -1 else None
        return out

    async def _committed(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp``; None when it cannot be had within a few seconds (asked
        while the batch lock or a rebalance is held: never wait on the broker for long there)."""
        try:
            committed: int | None = await asyncio.wait_for(
                consumer.committed(tp), min(5.0, self._settings.request_timeout_ms / 1000)
            )
        except (KafkaError, TimeoutError) as error:
            log.warning("could not read the committed offset of %s: %r", tp, error)
            return None
        return committed

    def _rewind(self, batch: dict[TopicPartition, list[Any]]) -> None:
        consumer = self._consumer
        assert consumer is not None
        for tp, records in batch.items():
            # A partition no longer assigned is skipped: its new owner starts from the committed offset.
            with contextlib.suppress(IllegalStateError):
                consumer.seek(tp, records[0].offset)

    # -- tracing -----------------------------------------------------------------------------

    @staticmethod
    def _parent_context(record: KafkaRecord, envelope: Envelope) -> Context:
        context = extract_context(record.headers)
        if trace.get_current_span(context).get_span_context().is_valid:
            return context
        return context_from_traceparent(envelope.traceparent)

    def _process_attributes(self, record: KafkaRecord, envelope: Envelope) -> dict[str, str | int]:
        return {
            semconv.MESSAGING_SYSTEM: semconv.KAFKA,
            semconv.MESSAGING_OPERATION_TYPE: "process",
            semconv.MESSAGING_OPERATION_NAME: "process",
            semconv.MESSAGING_DESTINATION_NAME: record.topic,
            semconv.MESSAGING_DESTINATION_PARTITION_ID: str(record.partition),
            semconv.MESSAGING_KAFKA_OFFSET: record.offset,
            semconv.MESSAGING_CONSUMER_GROUP_NAME: self._settings.group_id,
            semconv.MESSAGING_MESSAGE_ID: envelope.id,
            semconv.MESSAGING_KAFKA_MESSAGE_KEY: envelope.subject,
            semconv.EVENT_TYPE: envelope.type,
            semconv.EVENT_SUBJECT: envelope.subject,
        }


_TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)


async def _all_of(*awaitables: Awaitable[Any]) -> None:
    """Await every one of ``awaitables`` together; the first error is raised once all have settled (none is
    left running, or its error unread, when the transaction is aborted after it)."""
    outcomes = await asyncio.gather(*awaitables, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _blames_the_input(error: Exception) -> bool:
    """Whether a failed attempt says something about the records (so it counts against them), rather
    than about the broker or the network (a lost connection, a timeout: retried for as long as it lasts)."""
    if isinstance(error, _TOO_LARGE):
        return True
    if isinstance(error, OSError | TimeoutError):
        return False
    return not (isinstance(error, KafkaError) and error.retriable)


def _is_fatal(producer: AIOKafkaProducer | None, error: Exception) -> bool:
    if isinstance(error, ProducerFenced | UnsupportedVersionError):
        return True
    # aiokafka keeps the fatal state private; after it, every transactional call fails.
    txn_manager = getattr(producer, "_txn_manager", None)
    return bool(txn_manager is not None and txn_manager.is_fatal_error())


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no type hints
    def __init__(self, processor: Processor) -> None:
        self._processor = processor

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._processor._on_revoked()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._processor._on_assigned(assigned)
        self._processor.started.set()
