"""The thin shell every decision service runs: lead, fence, restore state from the log, then process.

0. **Lead** (services with one global state: quota, placement, preemption, node_health). Only the
   replica holding the lock (:mod:`services.common.leader`) goes on; standbys wait and take over
   when it dies. A leader that loses the lock exits.
1. **Fence.** A transactional producer with the service's ``transactional_id`` is started and
   stopped once, so whatever a killed predecessor (same instance id) left open is aborted before
   we read anything.
2. **Restore.** Every topic the state is a fold of is read from the beginning to its current end
   (read_committed) and each event is handed to ``state.restore``: the state is rebuilt from the
   log, including the service's own past decisions.
3. **Process.** The bus :class:`~gangline.bus.Processor` runs ``decide`` inside one Kafka
   transaction per batch. Input events already folded during the restore come again (those
   after the committed offsets); ``decide`` must treat them idempotently, which folds keyed by
   event, job and allocation ids do.

The processor may call a handler twice for one event (a batch aborted and retried). Handlers here
change the state when they decide, so a retry would see its own effect and decide nothing; the
:class:`Replayed` cache returns the outputs of the first call instead, keeping retries identical.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gangline.bus import DeadLetterOutputs, Outgoing, Processor, ProcessorSettings, RecordMeta, Select
from gangline.bus.consumer import decode_or_dead_letter
from gangline.bus.records import DeadLetter
from gangline.events.base import Envelope
from services.common.leader import Leadership

log = logging.getLogger(__name__)


class Restorable(Protocol):
    def restore(self, envelope: Envelope) -> None:
        """Fold one event read back from the log (a fact; decide nothing)."""


Decide = Callable[[Envelope, RecordMeta], Sequence[Outgoing]]


class Replayed:
    """Wraps a state-changing handler so a retried event gets the outputs of its first call."""

    def __init__(self, decide: Decide, *, remember: int = 100_000) -> None:
        self._decide = decide
        self._remember = remember
        self._outputs: OrderedDict[str, Sequence[Outgoing]] = OrderedDict()

    def __call__(self, envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        done = self._outputs.get(envelope.id)
        if done is not None:
            return done
        outputs = self._decide(envelope, meta)
        self._outputs[envelope.id] = outputs
        if len(self._outputs) > self._remember:
            self._outputs.popitem(last=False)
        return outputs


async def fence(settings: ProcessorSettings) -> None:
    """Abort whatever transaction an earlier incarnation of this replica left open."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        transactional_id=settings.transactional_id,
        enable_idempotence=True,
    )
    await producer.start()
    await producer.stop()


async def read_to_end(
    bootstrap: str,
    topics: Sequence[str],
    fold: Callable[[Envelope], None],
    *,
    service: str,
    select: Select | None = None,
) -> int:
    """Fold every committed event of ``topics`` (each topic in order), up to their current end; the count."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024,
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
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in layout[topic]]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            remaining = {tp for tp in tps if ends[tp] > 0}
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
) -> None:
    """Fence, restore ``state`` from ``restore_topics``, then run the processor until cancelled.

    With ``lock_topic`` (a one-partition topic) only one replica of the service decides at a time:
    the others wait for the lock (:mod:`services.common.leader`) and take over when the holder dies.
    """
    if lock_topic is None:
        await _restore_and_process(
            settings, state, decide, restore_topics, dead_letter_outputs, select, restore_select or select
        )
        return
    leadership = Leadership(
        settings.bootstrap_servers,
        group_id=f"{settings.group_id}.leader",
        topic=lock_topic,
        member=settings.instance_id,
        session_timeout_ms=settings.session_timeout_ms,
    )
    try:
        await leadership.acquire()
        work = asyncio.create_task(
            _restore_and_process(
                settings, state, decide, restore_topics, dead_letter_outputs, select, restore_select or select
            )
        )
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
        await leadership.release()


class LeadershipLost(Exception):
    """Another replica holds the lock now; this process must stop (and may be restarted as a standby)."""


async def _restore_and_process(
    settings: ProcessorSettings,
    state: Restorable,
    decide: Decide,
    restore_topics: Sequence[str],
    dead_letter_outputs: DeadLetterOutputs | None,
    select: Select | None,
    restore_select: Select | None,
) -> None:
    await fence(settings)
    started = time.perf_counter()
    events = await read_to_end(
        settings.bootstrap_servers,
        restore_topics,
        state.restore,
        service=settings.service,
        select=restore_select,
    )
    log.info(
        "state restored from the log",
        extra={"events": events, "seconds": round(time.perf_counter() - started, 3)},
    )
    processor = Processor(settings, Replayed(decide), dead_letter_outputs=dead_letter_outputs, select=select)
    await processor.run()
