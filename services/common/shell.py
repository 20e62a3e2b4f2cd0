"""The thin shell every decision service runs: lead, fence, restore state from the log, then process.

0. **Lead** (services with one global state: quota, placement, preemption, node_health). Only the
   replica holding the lock (:mod:`services.common.leader`) goes on; standbys wait and take over
   when it dies. A leader that loses the lock exits.
1. **Fence.** A transactional producer with the service's ``transactional_id`` is started and
   stopped once, so whatever a killed predecessor (same instance id) left open is aborted before
   we read anything.
2. **Restore.** Every topic the state is a fold of is read from the beginning to its current end
   (read_committed) and each event is handed to ``state.restore``: the state is rebuilt from the
   log, including the service's own past decisions. With ``snapshots`` the latest snapshot of the
   state is loaded first and the log is read only after the positions it covers
   (:mod:`services.common.snapshots`); the processor then adds snapshots to its transactions.
3. **Process.** The bus :class:`~gangline.bus.Processor` runs ``decide`` inside one Kafka
   transaction per batch. Input events already folded during the restore come again (those
   after the committed offsets); ``decide`` must treat them idempotently, which folds keyed by
   event, job and allocation ids do.

The processor may call a handler twice for one event (a batch aborted and retried). Handlers here
change the state when they decide, so a retry would see its own effect and decide nothing; the
:class:`Replayed` cache returns the outputs of the first call instead, keeping retries identical.
Only for the same record read again: an id that comes again in another record (a producer's retry,
or another event reusing the id) is decided afresh, never answered with the first one's outputs.

A service may also decide once per batch (``end_batch``: placement runs one scheduling cycle per
poll instead of one per event). Those outputs are caused by the batch's last event and cached with
that event's own outputs, so a retried batch publishes them again, and only once.

With ``record_inputs`` each output carries the input positions its batch decided on, starting from
where the restore stopped (:class:`~gangline.bus.processor.InputRecording`), so the decisions can be
replayed from the log (:mod:`services.common.replay`; placement: :mod:`services.placement.replay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gangline.bus import (
    DeadLetterOutputs,
    Outgoing,
    Processor,
    ProcessorSettings,
    RecordMeta,
    Refusal,
    Select,
)
from gangline.bus.consumer import decode_or_dead_letter
from gangline.bus.pools import PartitionOf
from gangline.bus.processor import InputRecording, transactional_producer
from gangline.bus.records import DeadLetter
from gangline.bus.security import client_options
from gangline.events.base import Envelope
from services.common.ids import Fingerprint, fingerprint
from services.common.leader import Leadership
from services.common.metrics import ServiceMetrics
from services.common.snapshots import StateSnapshots

log = logging.getLogger(__name__)


class Restorable(Protocol):
    def restore(self, envelope: Envelope) -> None:
        """Fold one event read back from the log (a fact; decide nothing)."""


Decide = Callable[[Envelope, RecordMeta], Sequence[Outgoing]]

EndBatch = Callable[[str], Sequence[Outgoing]]
"""Decide once after a batch of events was folded; given the id of the event to name as the cause."""


class Replayed:
    """Wraps a state-changing handler so a retried event gets the outputs of its first call."""

    def __init__(
        self,
        decide: Decide,
        *,
        end_batch: EndBatch | None = None,
        remember: int = 10_000,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        # A retry re-handles one uncommitted batch (max_batch_records, 500 by default): remembering many
        # more outputs only keeps objects alive for the garbage collector to walk.
        self._decide = decide
        self._end_batch = end_batch
        self._metrics = metrics
        self._remember = remember
        self._outputs: OrderedDict[str, tuple[Fingerprint, Sequence[Outgoing]]] = OrderedDict()

    def flush(self, given: Sequence[Envelope]) -> Sequence[Outgoing]:
        """The processor's per-batch hook: ``end_batch``'s outputs, remembered as the last event's."""
        if self._end_batch is None or not given:
            return []
        cause = given[-1].id
        started = time.perf_counter()
        outputs = [
            (topic, envelope.model_copy(update={"causationid": cause}))
            for topic, envelope in self._end_batch(cause)
        ]
        if self._metrics is not None:
            self._metrics.decided(outputs, time.perf_counter() - started)
        done = self._outputs.get(cause)
        if outputs and done is not None:
            # A retry of this batch replays the cause with these outputs (the state already holds them).
            self._outputs[cause] = (done[0], [*done[1], *outputs])
        return outputs

    def __call__(self, envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        key = fingerprint(envelope, meta.topic, meta.partition, meta.offset)
        done = self._outputs.get(envelope.id)
        if done is not None and done[0] == key:
            return done[1]
        started = time.perf_counter()
        outputs = self._decide(envelope, meta)
        if self._metrics is not None:
            # With a per-batch cycle that cycle is what is timed; folding one event is not a decision's cost.
            seconds = time.perf_counter() - started if self._end_batch is None else None
            self._metrics.decided(outputs, seconds)
        self._outputs[envelope.id] = (key, outputs)
        if len(self._outputs) > self._remember:
            self._outputs.popitem(last=False)
        return outputs


async def fence(settings: ProcessorSettings) -> AIOKafkaProducer:
    """Abort whatever transaction an earlier incarnation of this replica left open: start the processor's
    transactional producer, which the processor then uses (one producer start fewer before it runs)."""
    producer = transactional_producer(settings)
    try:
        await producer.start()
    except BaseException:
        await producer.stop()
        raise
    return producer


async def read_to_end(
    bootstrap: str,
    topics: Sequence[str],
    fold: Callable[[Envelope], None],
    *,
    service: str,
    select: Select | None = None,
    read_up_to: dict[tuple[str, int], int] | None = None,
    start: Mapping[tuple[str, int], int] | None = None,
    partitions: Mapping[str, Sequence[int]] | None = None,
) -> int:
    """Fold every committed event of ``topics`` (each topic in order), up to their current end; the count.

    ``read_up_to``, when given, receives the offset each ``(topic, partition)`` was read up to.
    ``start``: where to begin reading a ``(topic, partition)`` (one not named: at its beginning).
    ``partitions``: per topic, the partitions to read (a pool's, :mod:`gangline.bus.pools`); a topic not
    named: all of them.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **client_options(),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        # What is read is in the log already: a fetch's long poll would only hold up the offset
        # requests queued behind it on the connection (half a second per topic at the default).
        fetch_max_wait_ms=RESTORE_FETCH_WAIT_MS,
    )
    await consumer.start()
    count = 0
    try:
        # Before anything is assigned the metadata request covers every topic.
        await consumer._client.force_metadata_update()
        layout = {topic: sorted(consumer.partitions_for_topic(topic) or ()) for topic in topics}
        missing = [topic for topic, partitions in layout.items() if not partitions]
        if missing:
            raise RuntimeError(f"topics missing on the broker: {missing}")
        for topic, only in (partitions or {}).items():
            if topic in layout:
                if set(only) - set(layout[topic]):
                    raise RuntimeError(f"{topic} has no partition {sorted(set(only) - set(layout[topic]))}")
                layout[topic] = sorted(only)
        # Every end in one request, before any fetch is under way.
        ends = await consumer.end_offsets([TopicPartition(t, p) for t in topics for p in layout[t]])
        if read_up_to is not None:
            read_up_to.update({(tp.topic, tp.partition): offset for tp, offset in ends.items()})
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in layout[topic]]
            begin = {tp: (start or {}).get((tp.topic, tp.partition)) for tp in tps}
            remaining = {tp for tp in tps if ends[tp] > (begin[tp] or 0)}
            if not remaining:
                continue  # read to its end already (a snapshot covers it, or it is empty): no request
            consumer.assign(sorted(remaining))
            # Only a partition read from its beginning asks the broker where that is (one request).
            fresh = [tp for tp in remaining if begin[tp] is None]
            if fresh:
                await consumer.seek_to_beginning(*fresh)
            for tp in remaining:
                offset = begin[tp]
                if offset is not None:
                    consumer.seek(tp, offset)
            while remaining:
                batch = await consumer.getmany(*remaining, timeout_ms=500, max_records=5000)
                for tp, records in batch.items():
                    for record in records:
                        if record.offset >= ends[tp]:
                            break
                        if select is not None and not select(record):
                            continue
                        outcome = decode_or_dead_letter(record, registry=None, source_service=service)
                        if not isinstance(outcome, DeadLetter):
                            fold(outcome)
                            count += 1
                for tp in list(remaining):
                    if await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)
    finally:
        await consumer.stop()
    return count


async def restore_and_process(
    settings: ProcessorSettings,
    state: Restorable,
    decide: Decide,
    *,
    restore_topics: Sequence[str],
    dead_letter_outputs: DeadLetterOutputs | None = None,
    select: Select | None = None,
    restore_select: Select | None = None,
    lock_topic: str | None = None,
    end_batch: EndBatch | None = None,
    record_inputs: bool = False,
    started: datetime | None = None,
    refusal: Refusal | None = None,
    metrics: ServiceMetrics | None = None,
    snapshots: StateSnapshots | None = None,
    partition_of: PartitionOf | None = None,
    lock_home: bool = False,
) -> None:
    """Fence, restore ``state`` from ``restore_topics``, then run the processor until cancelled.

    A pool's owner (:mod:`services.common.pools`) reads only its pool's partitions of the pooled topics
    (``settings.input_partitions``, the restore too) and sends its outputs there (``partition_of``, the
    bus's :data:`~gangline.bus.pools.PartitionOf`; quota sends each routed job to its pool's).

    With ``snapshots`` (needs ``record_inputs``) the restore starts from the latest snapshot of the state
    and the processor writes new ones (:mod:`services.common.snapshots`).

    With ``metrics`` the decisions are counted and timed, and the processor is watched (its
    transactions, dead letters and lag: :mod:`services.common.metrics`).

    With ``refusal`` an event whose outputs say it was refused is dead-lettered as well (the bus's
    :data:`~gangline.bus.Refusal`).

    With ``end_batch`` the state decides once per batch too, after ``decide`` folded each event.
    With ``record_inputs`` the outputs carry the input positions they were decided on (module docstring);
    ``started``, when the state counts time from its creation, is recorded with them.

    With ``lock_topic`` (a one-partition topic) only one replica of the service decides at a time:
    the others wait for the lock (:mod:`services.common.leader`) and take over when the holder dies
    (``lock_session_timeout_ms`` after its last heartbeat); the leader's processor joins no consumer
    group (``ProcessorSettings.group_membership``). With ``lock_home`` this replica is the lock's home:
    a holder that is not hands the lock over when it joins (:mod:`services.common.leader`; the holder
    raises :class:`LeadershipLost`); so a home with snapshots restores to the log's end before it joins,
    and the lock moves only for the fence and the tail after that.
    Such a service commits its consumed offsets every ``idle_commit_ms`` rather than in every
    transaction (ProcessorSettings.offsets_in_every_transaction): whoever starts next re-reads at most
    that much input, whose decisions its restored state already holds.
    """

    if lock_topic is not None:
        # One leader at a time, whose state is rebuilt from the log (its own decisions included) when
        # it starts: an input read again after a crash or a failover decides nothing again, so the
        # consumed offsets need not ride in every transaction (two round trips fewer per batch).
        # The lock says who consumes: the leader's consumer joins no group (a dead leader's membership
        # would hold up the next one's join until its session expired).
        settings = settings.model_copy(
            update={
                "transactional_role": "leader",
                "offsets_in_every_transaction": False,
                "group_membership": False,
            }
        )

    def restore_and_process(warm: WarmStandby | None = None) -> Coroutine[Any, Any, None]:
        return _restore_and_process(
            settings,
            state,
            Replayed(decide, end_batch=end_batch, remember=_remember(settings), metrics=metrics),
            restore_topics,
            dead_letter_outputs,
            select,
            restore_select or select,
            record_inputs,
            started,
            refusal,
            metrics,
            snapshots,
            warm,
            partition_of,
        )

    if lock_topic is None:
        await restore_and_process()
        return
    if metrics is not None:
        metrics.phase = "standby"
    leadership = Leadership(
        settings.bootstrap_servers,
        group_id=f"{settings.group_id}.leader",
        topic=lock_topic,
        member=settings.instance_id,
        session_timeout_ms=settings.lock_session_timeout_ms,
        home=lock_home,
    )
    # With snapshots, a state restored ahead of the lock (a snapshot and the log after it) is one a restart
    # could load: the standby keeps it read up to the log's end, and the leader it becomes reads only what
    # came after (WarmStandby). Without, the fold may depend on reading the log in one pass: cold.
    warm = (
        WarmStandby(settings, state, restore_topics, restore_select or select, snapshots)
        if snapshots
        else None
    )
    warming = asyncio.create_task(warm.run()) if warm is not None else None
    try:
        if lock_home and warm is not None and warming is not None:
            # A home claim takes the lock from its holder at once: restored first (up to the log's end now),
            # the pool goes undecided only while the fence and the short tail after that pass are read.
            await warm.restored_once(warming)
        await leadership.acquire()
        if warm is not None and warming is not None:
            await warm.finish(warming)
        work = asyncio.create_task(restore_and_process(warm))
        lost = asyncio.create_task(leadership.lost.wait())
        try:
            done, _ = await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, lost):
                task.cancel()
            for task in (work, lost):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if lost in done:
            raise LeadershipLost(f"{settings.service} {settings.instance_id} lost the leadership; exiting")
        work.result()
    finally:
        if warming is not None and not warming.done():
            warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await warming
        await leadership.release()


WARM_REFRESH_S = 1.0
"""How often a warm standby reads what the leader's log gained since its last pass."""


class WarmStandby:
    """A standby's state, restored while it waits for the lock: the latest snapshot loaded, then the log
    read to its end again every ``WARM_REFRESH_S``. Taking over, the leader fences its predecessor and
    reads only the log after :attr:`positions`, exactly as a restart reads the tail after a snapshot's
    positions (so this is offered only to states that snapshot: their fold of a snapshot and the tail is
    the fold of the whole log)."""

    def __init__(
        self,
        settings: ProcessorSettings,
        state: Restorable,
        topics: Sequence[str],
        select: Select | None,
        snapshots: StateSnapshots,
    ) -> None:
        self._settings, self._state, self._topics, self._select = settings, state, topics, select
        self._snapshots = snapshots
        self._stopping = asyncio.Event()
        self._passed = asyncio.Event()
        """Set once the first pass over the log ended (or the warm state failed)."""
        self._failed: BaseException | None = None
        self.positions: dict[tuple[str, int], int] = {}
        """Where the state has read each partition of the restore topics up to."""
        self.events = 0
        """Events folded since the snapshot (for when the next one is due)."""

    async def run(self) -> None:
        """Load the snapshot, then pass over the log's new end until :meth:`finish` (each pass whole)."""
        settings = self._settings
        try:
            self.positions = await self._snapshots.load(
                settings.bootstrap_servers, security=settings.security
            )
            while True:
                reached: dict[tuple[str, int], int] = {}
                self.events += await read_to_end(
                    settings.bootstrap_servers,
                    self._topics,
                    self._state.restore,
                    service=settings.service,
                    select=self._select,
                    read_up_to=reached,
                    start=self.positions,
                    partitions=settings.input_partitions,
                )
                self.positions = reached
                self._passed.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), WARM_REFRESH_S)
                if self._stopping.is_set():
                    return
        except Exception as error:  # a pass cut short leaves the state ahead of its positions
            self._failed = error
            log.warning("the standby's warm state is unusable: %r", error)
        finally:
            self._passed.set()

    async def restored_once(self, task: asyncio.Task[None]) -> None:
        """Wait until the snapshot is loaded and the log read once to its end (``task`` runs :meth:`run`);
        a failed state returns too (:meth:`finish` raises then)."""
        passed = asyncio.ensure_future(self._passed.wait())
        try:
            await asyncio.wait({passed, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            passed.cancel()

    async def finish(self, task: asyncio.Task[None]) -> None:
        """Stop after the pass in hand; raises when the state cannot be used (the process then starts
        again, cold)."""
        self._stopping.set()
        await task
        if self._failed is not None:
            raise RuntimeError(
                "the standby's warm state is unusable; exiting to start cold"
            ) from self._failed


RESTORE_FETCH_WAIT_MS = 20
"""How long a fetch of the restore waits for more data (the broker's default: 500 ms)."""


def settle_garbage_collector() -> None:
    """Keep the collector's pauses short while deciding: a full collection walks every object alive.

    The restored state (tens of thousands of events folded) is frozen out of the collector's reach,
    and young collections run less often; what lives on is still collected, only in fewer, larger steps.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 100)


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between young collections (CPython's default is 700)."""


def _remember(settings: ProcessorSettings) -> int:
    """How many events' outputs the replay cache keeps: a few batches' worth, at least 10,000."""
    batch: int = settings.max_batch_records
    return max(10_000, 4 * batch)


class LeadershipLost(Exception):
    """Another replica holds the lock now; this process must stop (and may be restarted as a standby)."""


async def _restore_and_process(
    settings: ProcessorSettings,
    state: Restorable,
    decide: Replayed,
    restore_topics: Sequence[str],
    dead_letter_outputs: DeadLetterOutputs | None,
    select: Select | None,
    restore_select: Select | None,
    record_inputs: bool = False,
    state_started: datetime | None = None,
    refusal: Refusal | None = None,
    metrics: ServiceMetrics | None = None,
    snapshots: StateSnapshots | None = None,
    warm: WarmStandby | None = None,
    partition_of: PartitionOf | None = None,
) -> None:
    if metrics is not None:
        metrics.phase = "restoring"
    producer = await fence(settings)
    try:
        processor = await _restore(
            settings,
            state,
            decide,
            restore_topics,
            dead_letter_outputs,
            select,
            restore_select,
            record_inputs,
            state_started,
            refusal,
            snapshots,
            producer,
            warm,
            partition_of,
        )
    except BaseException:
        await producer.stop()
        raise
    if metrics is not None:
        metrics.watch(processor)
        metrics.phase = "processing"
    await processor.run()


async def _restore(
    settings: ProcessorSettings,
    state: Restorable,
    decide: Replayed,
    restore_topics: Sequence[str],
    dead_letter_outputs: DeadLetterOutputs | None,
    select: Select | None,
    restore_select: Select | None,
    record_inputs: bool,
    state_started: datetime | None,
    refusal: Refusal | None,
    snapshots: StateSnapshots | None,
    producer: AIOKafkaProducer,
    warm: WarmStandby | None = None,
    partition_of: PartitionOf | None = None,
) -> Processor:
    """Restore ``state`` (the predecessor fenced by ``producer``), and the processor to run on it. A
    ``warm`` state (restored while standing by) only reads the log after where it got to."""
    started = time.perf_counter()
    restored: dict[tuple[str, int], int] = {}
    if warm is not None:
        start, before = warm.positions, warm.events
    else:
        start = (
            await snapshots.load(settings.bootstrap_servers, security=settings.security) if snapshots else {}
        )
        before = 0
    events = before + await read_to_end(
        settings.bootstrap_servers,
        restore_topics,
        state.restore,
        service=settings.service,
        select=restore_select,
        read_up_to=restored,
        start=start,
        partitions=settings.input_partitions,
    )
    if snapshots is not None:
        snapshots.restored(events)
    log.info(
        "state restored from the log",
        extra={
            "events": events,
            "seconds": round(time.perf_counter() - started, 3),
            "snapshot": snapshots.loaded if snapshots is not None else None,
            "warm": warm is not None,
        },
    )
    settle_garbage_collector()
    # One id per run: a replay sees where the state was rebuilt from the log.
    inputs = InputRecording(uuid.uuid4().hex, restored, state_started) if record_inputs else None
    return Processor(
        settings,
        decide,
        dead_letter_outputs=dead_letter_outputs,
        select=select,
        flush=decide.flush,
        inputs=inputs,
        refusal=refusal,
        snapshots=snapshots,
        chain_resume=snapshots.chain if snapshots is not None else None,
        producer=producer,
        partition_of=partition_of,
    )
