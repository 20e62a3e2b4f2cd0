"""Quota's shell: restore usage from the log, then gate admitted jobs in Kafka transactions."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Container, Iterable, Sequence
from datetime import UTC, datetime

from gangline.bus import Outgoing, RecordMeta
from gangline.bus.records import KafkaRecord
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import Profile, load_profile_file
from gangline.events.base import Envelope
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
from services.quota.status import StatusBoard

log = logging.getLogger(__name__)

SERVICE = "quota"
QUOTA_EVENTS = (
    "job.admitted",
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
    """What quota consumes."""
    return (*job_topics(topics), *node_topics(topics))


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
    (keyed by queue), which only its restore reads."""
    kinds = dict.fromkeys(wanted, True)
    nodes = frozenset((*node_topics(topics), topics.queue_status))
    of_jobs = unless_keyed_by(retired, select_types(kinds))
    of_nodes = select_types(kinds, not_ours=nodes)

    def select(record: KafkaRecord) -> bool:
        return of_nodes(record) if record.topic in nodes else of_jobs(record)

    return select


def new_state(settings: QuotaSettings, queues: Queues | None = None) -> QuotaState:
    """An empty state under ``settings``; ``queues`` when already read from ``settings.queues_file``."""
    return QuotaState(
        topics=topic_names(settings),
        queues=queues if queues is not None else load_queues(settings.queues_file),
        half_life_s=settings.fair_share_half_life_s,
        status=StatusBoard(interval_s=settings.status_interval_s),
        starvation_s=gate_profile(settings).settings.starvation_s,
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
    return {"queues": digest, "half_life_s": settings.fair_share_half_life_s}


def state_snapshots(settings: QuotaSettings, state: QuotaState) -> StateSnapshots | None:
    """Quota's snapshots under ``settings``: None when they are off, or with a fair-share half-life.

    A snapshot covers quota's inputs; queues.status (one record per queue, compacted) is read whole at
    every start, so the status board is not in it. With a half-life the decayed usage is the one thing
    a restore from the log does not rebuild exactly as the running service folded it: the restore reads
    topic by topic, so a requeued job's ``job.queued`` is read before the release of its previous
    attempt and the gap between them, uncharged while the service ran, is charged
    (services/quota/replay.py). A snapshot holds the running service's usage; the replay rebuilds a
    restart from the whole log: they would differ by that gap. Until the restore dates that gap back,
    quota snapshots only under plain DRF (half-life 0), where a restart from a snapshot and the tail
    is exactly the rebuild (tests/unit/services/test_quota_snapshots.py).
    """
    if settings.fair_share_half_life_s > 0:
        if settings.snapshots:
            log.info(
                "no snapshots under a fair-share half-life; a start reads the whole log",
                extra={"half_life_s": settings.fair_share_half_life_s},
            )
        return None
    return settings.state_snapshots(
        state,
        topic=state.topics.snapshots(SERVICE),
        service=SERVICE,
        restore_topics=input_topics(state.topics),
        config=snapshot_config(settings),
    )


async def main(settings: QuotaSettings) -> None:
    metrics = ServiceMetrics(SERVICE)
    state = new_state(settings)
    quota_metrics.watch(metrics, state)
    topics = state.topics

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        return decide(envelope, state, now=datetime.now(UTC))

    inputs = list(input_topics(topics))
    snapshots = state_snapshots(settings, state)
    async with metrics.serve(settings):
        await restore_and_process(
            processor_settings(settings, SERVICE, inputs),
            state,
            handle,
            restore_topics=list(restore_topics(topics)),
            select=quota_select(topics, state.retired, (*QUOTA_EVENTS, *NODE_EVENTS)),
            restore_select=quota_select(topics, state.retired, RESTORE_EVENTS),
            lock_topic=topics.inventory,
            # Outputs name the batch and positions they were decided on (replayed: services/quota/replay.py).
            record_inputs=True,
            metrics=metrics,
            # The state with the batch that wrote it; a restart loads the latest and reads only the tail.
            snapshots=snapshots,
        )
