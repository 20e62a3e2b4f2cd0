"""Quota's shell: restore usage from the log, then gate admitted jobs in Kafka transactions."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gangline.bus import EventProducer, Outgoing, RecordMeta
from gangline.bus.pools import PartitionOf
from gangline.bus.records import KafkaRecord
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import Profile, load_profile_file
from gangline.events.base import Envelope
from gangline.events.types import JobId
from gangline.fold.cordons import CORDON_EVENTS
from gangline.queues_file import load_queues_file
from services.common.env import processor_settings, topic_names
from services.common.metrics import ServiceMetrics
from services.common.queues import Queues, load_queues
from services.common.select import select_types, unless_keyed_by
from services.common.shell import restore_and_process
from services.common.snapshots import StateSnapshots
from services.common.topics import TopicNames
from services.quota import metrics as quota_metrics
from services.quota.handlers import QuotaState, decide
from services.quota.settings import QuotaSettings
from services.quota.status import StatusBoard, held_back, tick

SERVICE = "quota"
QUOTA_EVENTS = (
    "job.admitted",
    "job.routed",
    "job.queued",
    "job.requeued",
    "job.completed",
    "job.failed",
    "allocation.granted",
    "allocation.released",
)
NODE_EVENTS = ("node.registered", "node.failed", "gpu.health_changed", *CORDON_EVENTS)
"""What the node inventory is a fold of: which GPU models can hold a job's workers at all (a cordoned
node's GPUs cannot)."""
TICK_EVENTS = ("quota.ticked",)
"""Quota's own clock on quota.ticks (``tick_when_quiet``): read live only; a restore has nothing to fold."""
LIVE_EVENTS = (*QUOTA_EVENTS, *NODE_EVENTS, *TICK_EVENTS)
"""What quota decides on, live and in its replay."""
STATUS_EVENTS = ("queue.status",)
"""Quota's own output on queues.status, read back at start: what it last published (the throttle)."""
RESTORE_EVENTS = (*QUOTA_EVENTS, *NODE_EVENTS, "job.pending", *STATUS_EVENTS)
"""The restore also reads pending reasons (quota's own say what it last told each waiting job) and its
latest queue statuses."""


def job_topics(topics: TopicNames) -> tuple[str, ...]:
    """Quota's inputs keyed by job id."""
    return (topics.events, topics.allocations)


def node_topics(topics: TopicNames) -> tuple[str, ...]:
    """Quota's inputs keyed by node id: the inventory, what broke, and the operators' cordons."""
    return (topics.inventory, topics.health, topics.operator)


def input_topics(topics: TopicNames) -> tuple[str, ...]:
    """What quota consumes: the job and node topics, and its own ticks."""
    return (*job_topics(topics), *node_topics(topics), topics.quota_ticks)


def output_topics(topics: TopicNames) -> tuple[str, ...]:
    """What quota writes: its decisions about jobs, and the queues' status."""
    return (topics.events, topics.queue_status)


def restore_topics(topics: TopicNames) -> tuple[str, ...]:
    """What quota restores its state from, in that order: its inputs, then its latest queue statuses."""
    return (*input_topics(topics), topics.queue_status)


def quota_select(
    topics: TopicNames, retired: Container[str], wanted: Iterable[str]
) -> Callable[[KafkaRecord], bool]:
    """Decode the ``wanted`` types; on the job topics skip retired jobs' records undecoded (most of what
    quota reads is about finished jobs or jobs of unlimited queues). The node topics are keyed by node
    and dead-lettered by placement, so quota skips what it cannot read there; so it does on queues.status
    (keyed by queue), which only its restore reads, and on quota.ticks (keyed by cohort)."""
    kinds = dict.fromkeys(wanted, True)
    nodes = frozenset((*node_topics(topics), topics.queue_status, topics.quota_ticks))
    of_jobs = unless_keyed_by(retired, select_types(kinds))
    of_nodes = select_types(kinds, not_ours=nodes)

    def select(record: KafkaRecord) -> bool:
        return of_nodes(record) if record.topic in nodes else of_jobs(record)

    return select


def new_state(settings: QuotaSettings, queues: Queues | None = None) -> QuotaState:
    """An empty state under ``settings``; ``queues`` when already read from ``settings.queues_file``."""
    profile = gate_profile(settings)
    return QuotaState(
        topics=topic_names(settings),
        queues=queues if queues is not None else load_queues(settings.queues_file),
        half_life_s=settings.fair_share_half_life_s,
        status=StatusBoard(interval_s=settings.status_interval_s),
        pools=settings.pool_layout,
        starvation_s=profile.settings.starvation_s,
        line_order=profile.settings.line_order,
        gate_reserve=profile.settings.gate_reserve,
    )


def gate_profile(settings: QuotaSettings) -> Profile:
    """The scheduling profile placement runs, whose gate settings quota applies."""
    if settings.profile_path:
        return load_profile_file(settings.profile_path, placement_registry())
    return default_profile()


def snapshot_config(settings: QuotaSettings) -> dict[str, object]:
    """The settings quota's fold depends on: a snapshot written under others is not loaded (the queue
    configuration, by digest: which queues are limited, their trees, what a job is charged; the
    fair-share half-life)."""
    doc = load_queues_file(settings.queues_file).model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    layout = settings.pool_layout
    pools = {"pools": str(layout)} if layout is not None else {}  # no pools: as before they existed
    return {"queues": digest, "half_life_s": settings.fair_share_half_life_s, **pools}


def state_snapshots(settings: QuotaSettings, state: QuotaState) -> StateSnapshots | None:
    """Quota's snapshots under ``settings`` (None when they are off).

    A snapshot covers quota's inputs; queues.status (one record per queue, compacted) is read whole at
    every start, so the status board is not in it. The decayed usage in it is what a restore from the
    log rebuilds: each charge counts from the time of the fact that made it to the time of the one that
    ended it, whatever order the restore reads them in (tests/unit/services/test_quota_snapshots.py).
    """
    return settings.state_snapshots(
        state,
        topic=state.topics.snapshots(SERVICE),
        service=SERVICE,
        restore_topics=input_topics(state.topics),
        config=snapshot_config(settings),
    )


@dataclass
class Quiet:
    """When quota last handled an input (the monotonic clock), for :func:`tick_when_quiet`."""

    heard_at: float = field(default_factory=time.monotonic)

    def heard(self) -> None:
        self.heard_at = time.monotonic()

    def for_s(self) -> float:
        return time.monotonic() - self.heard_at


async def tick_when_quiet(
    state: QuotaState,
    quiet: Quiet,
    send: Callable[[str, Envelope], Awaitable[object]],
    *,
    interval_s: float,
    ready: Callable[[], bool] = lambda: True,
) -> None:
    """Run until cancelled: whenever quota has read nothing for ``interval_s`` while a tree's status is held
    back by the throttle (``status.held_back``), send a ``quota.ticked`` per such tree to quota.ticks (quota
    reads it back and publishes what is due: services/quota/status.py). ``ready``: the state is restored
    and decides (a standby's or a restoring state ticks nothing). A tick read back counts as heard, so one
    quiet spell gives one tick per tree; a tick sent twice (a failover) publishes nothing the second time."""
    while True:
        await asyncio.sleep(max(interval_s - quiet.for_s(), interval_s / 10, 0.05))
        if quiet.for_s() < interval_s or not ready():
            continue
        held = held_back(state)
        for cohort in held:
            await send(
                state.topics.quota_ticks, tick(cohort, at=datetime.now(UTC), event_id=str(uuid.uuid4()))
            )
        if held:
            quiet.heard()  # the ticks are on their way: the next check waits for them to be read


async def main(settings: QuotaSettings) -> None:
    metrics = ServiceMetrics(SERVICE)
    state = new_state(settings)
    quota_metrics.watch(metrics, state)
    topics = state.topics
    quiet = Quiet()

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        quiet.heard()
        return decide(envelope, state, now=datetime.now(UTC))

    inputs = list(input_topics(topics))
    snapshots = state_snapshots(settings, state)
    interval_s = settings.status_interval_s
    async with (
        metrics.serve(settings),
        EventProducer(
            settings.kafka_bootstrap, client_id="quota-ticks", security=settings.kafka_security
        ) as ticks,
    ):
        # Nothing is held back when every change is published at once (interval 0).
        ticking = asyncio.create_task(
            tick_when_quiet(
                state,
                quiet,
                ticks.publish,
                interval_s=interval_s,
                ready=lambda: metrics.phase == "processing",
            )
            if interval_s > 0
            else asyncio.Event().wait()
        )
        try:
            await restore_and_process(
                processor_settings(settings, SERVICE, inputs),
                state,
                handle,
                restore_topics=list(restore_topics(topics)),
                select=quota_select(topics, state.retired, LIVE_EVENTS),
                restore_select=quota_select(topics, state.retired, RESTORE_EVENTS),
                lock_topic=topics.inventory,
                # Outputs name the batch and positions they were decided on (replayed: quota/replay.py).
                record_inputs=True,
                metrics=metrics,
                # The state with the batch that wrote it; a restart loads the latest and reads only the tail.
                snapshots=snapshots,
                # With pools, what it writes about a routed job goes to its pool's partition
                # (gangline.bus.pools).
                partition_of=pool_partitions(state) if state.pools is not None else None,
            )
        finally:
            ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticking


def pool_partitions(state: QuotaState) -> PartitionOf:
    """With pools: what quota writes about a routed job (its ``job.routed``, ``job.queued``, pending reasons,
    failure) goes to its pool's partition, so the pool's owners read it; the rest by key."""
    layout = state.pools
    assert layout is not None
    pooled = frozenset(state.topics.pooled())

    def partition_of(topic: str, envelope: Envelope) -> int | None:
        pool = state.routed.get(JobId(envelope.subject)) if topic in pooled else None
        return layout.partition(pool) if pool is not None else None

    return partition_of
