"""Node health's shell: restore nodes and allocations from the log, then watch heartbeats."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from gangline.bus import Outgoing, RecordMeta
from gangline.core.pools import PoolLayout
from gangline.events.base import Envelope
from services.common.env import processor_settings, topic_names
from services.common.metrics import ServiceMetrics
from services.common.pools import Seat, home_pools, restore_and_process_seat, run_seats, seats
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
POOL_NODE_HEALTH_EVENTS = tuple("job.routed" if t == "job.admitted" else t for t in NODE_HEALTH_EVENTS)
"""What a pool's node_health reads: a job is its pool's from its ``job.routed`` (gangline.core.pools)."""


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
    layout = settings.pool_layout
    if layout is not None:
        await main_pools(settings, layout)
        return
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


async def main_pools(settings: NodeHealthSettings, layout: PoolLayout) -> None:
    """node_health with pools: one seat per pool (services.common.pools), watching its pool's nodes alone
    (their heartbeats, health and allocations are on its partitions; silence is judged by its pool's
    heartbeats, so a pool whose agents lost the bus is not judged by another pool's)."""
    metrics = ServiceMetrics(SERVICE)
    topics = topic_names(settings)
    inputs = [topics.inventory, topics.health, topics.operator, topics.allocations, topics.heartbeats]
    home = home_pools(
        layout,
        group=settings.pool_group_names,
        instance_id=settings.instance_id,
        replicas=settings.pool_replicas,
    )

    async def run_seat(seat: Seat) -> None:
        state = new_state(settings, now=datetime.now(UTC))
        base = processor_settings(settings, SERVICE, [*inputs, topics.events])
        await restore_and_process_seat(
            seat,
            base,
            state,
            handler(state, lambda: datetime.now(UTC)),
            service=SERVICE,
            topics=topics,
            restore_topics=restore_topics(topics),
            snapshots=settings,
            snapshot_config=snapshot_config(settings),
            metrics=metrics,
            select=select_types(dict.fromkeys(POOL_NODE_HEALTH_EVENTS, True)),
            started=state.started,
        )

    async with metrics.serve(settings):
        await run_seats(seats(layout, home), run_seat, standby_delay_s=settings.pool_standby_delay_s)
