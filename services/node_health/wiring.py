"""Node health's shell: restore nodes and allocations from the log, then watch heartbeats."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from gangline.bus import Outgoing, RecordMeta
from gangline.events.base import Envelope
from services.common.env import processor_settings, topic_names
from services.common.metrics import ServiceMetrics
from services.common.select import select_types
from services.common.shell import restore_and_process
from services.common.snapshots import StateSnapshots
from services.common.topics import TopicNames
from services.node_health.handlers import NodeHealthState, decide
from services.node_health.rates import GpuErrorRates
from services.node_health.settings import NodeHealthSettings

SERVICE = "node_health"
NODE_HEALTH_EVENTS = (
    "node.registered",
    "node.heartbeat",
    "node.failed",
    "gpu.health_changed",
    "gpu.error_reported",
    "allocation.granted",
    "allocation.released",
    "job.checkpointed",
    "node.cordoned",
    "node.uncordoned",
    "job.admitted",
    "job.preempting",
    "job.completed",
    "job.failed",
)


def record_time(timestamp_ms: int | None) -> datetime | None:
    """A record's timestamp in the log as a time (None when it has none)."""
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms and timestamp_ms > 0 else None


def new_state(settings: NodeHealthSettings, *, now: datetime) -> NodeHealthState:
    return NodeHealthState(
        topics=topic_names(settings),
        silence=timedelta(seconds=settings.silence_s),
        check_every=timedelta(seconds=settings.check_every_s),
        started=now,
        outage_gap=timedelta(seconds=settings.outage_gap_s) if settings.outage_gap_s is not None else None,
        rates=GpuErrorRates(settings.drain_policy()),
    )


def handler(
    state: NodeHealthState, clock: Callable[[], datetime]
) -> Callable[[Envelope, RecordMeta], Sequence[Outgoing]]:
    """The processor's handler: ``decide`` at the clock's ``now``; a heartbeat heard at its record's time."""

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        return decide(envelope, state, now=clock(), heard_at=record_time(meta.timestamp_ms))

    return handle


def restore_topics(topics: TopicNames) -> list[str]:
    """What node_health restores its state from (old heartbeats say nothing about now)."""
    return [topics.inventory, topics.health, topics.operator, topics.allocations, topics.events]


def snapshot_config(settings: NodeHealthSettings) -> dict[str, object]:
    """The settings node_health's fold depends on (the error windows' policy): a snapshot written under
    others is not loaded."""
    policy = settings.drain_policy()
    return {
        "error_window_s": policy.window.total_seconds(),
        "job_fault_xids": policy.job_fault_xids,
        "warning_xids": policy.warning_xids,
        "correctable_ecc": policy.correctable_ecc,
    }


def state_snapshots(settings: NodeHealthSettings, state: NodeHealthState) -> StateSnapshots | None:
    """node_health's snapshots under ``settings`` (None when they are off)."""
    return settings.state_snapshots(
        state,
        topic=state.topics.snapshots(SERVICE),
        service=SERVICE,
        restore_topics=restore_topics(state.topics),
        config=snapshot_config(settings),
    )


async def main(settings: NodeHealthSettings) -> None:
    metrics = ServiceMetrics(SERVICE)
    state = new_state(settings, now=datetime.now(UTC))
    topics = state.topics

    handle = handler(state, lambda: datetime.now(UTC))
    inputs = [topics.inventory, topics.health, topics.operator, topics.allocations, topics.heartbeats]
    async with metrics.serve(settings):
        await restore_and_process(
            processor_settings(settings, SERVICE, [*inputs, topics.events]),
            state,
            handle,
            # Old heartbeats say nothing about now: restore counts silence from the service's start.
            restore_topics=restore_topics(topics),
            select=select_types(dict.fromkeys(NODE_HEALTH_EVENTS, True)),
            lock_topic=topics.inventory,
            # Outputs name the batch, positions and run start (replayed: services/node_health/replay.py).
            record_inputs=True,
            started=state.started,
            metrics=metrics,
            # The state with the batch that wrote it; a restart loads the latest and reads only the tail.
            snapshots=state_snapshots(settings, state),
        )
