"""Preemption's shell: mirror the cluster from the log, then act on pending urgent jobs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from gangline.bus import Outgoing, RecordMeta
from gangline.core.actions.queueing import PreemptionPolicy
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import load_profile_file
from gangline.core.pools import PoolLayout
from gangline.events.base import Envelope
from gangline.fold.cluster import FOLDED_EVENTS, POOL_FOLDED_EVENTS
from services.common.env import processor_settings, topic_names
from services.common.metrics import ServiceMetrics
from services.common.pools import Seat, home_pools, restore_and_process_seat, run_seats, seats
from services.common.queues import Queues, load_queues
from services.common.select import select_types
from services.common.shell import restore_and_process
from services.preemption import metrics as preemption_metrics
from services.preemption.handlers import Mirror, PreemptionState, end_batch, fold_event
from services.preemption.settings import PreemptionSettings

SERVICE = "preemption"


def new_state(settings: PreemptionSettings, queues: Queues | None = None) -> PreemptionState:
    profile = (
        load_profile_file(settings.profile_path, placement_registry())
        if settings.profile_path
        else default_profile()
    )
    if queues is None:
        queues = load_queues(settings.queues_file)
    return PreemptionState(
        mirror=Mirror(
            topics=topic_names(settings),
            profile=profile,
            gated=settings.gated,
            unlimited_queues=frozenset(queues.unlimited),
        ),
        tree=queues.whole_tree,
        # The deadline is the victim's own grace (0: at once), as the checkpoint protocol says.
        policy=PreemptionPolicy(
            min_runtime_s=settings.min_runtime_s, default_grace_s=0.0, grow_in_cycle=False
        ),
    )


def snapshot_config(state: PreemptionState) -> dict[str, object]:
    """The settings preemption's fold depends on: a snapshot written under others is not loaded."""
    return {"gated": state.mirror.gated, "unlimited_queues": sorted(state.mirror.unlimited_queues)}


async def main(settings: PreemptionSettings) -> None:
    layout = settings.pool_layout
    if layout is not None:
        await main_pools(settings, layout)
        return
    metrics = ServiceMetrics(SERVICE)
    state = new_state(settings)
    preemption_metrics.watch(metrics, state)
    topics = state.mirror.topics

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        return fold_event(envelope, state, now=datetime.now(UTC))

    def search(cause: str) -> Sequence[Outgoing]:
        # One victim search per batch, for the jobs found pending in it.
        return end_batch(state, now=datetime.now(UTC))

    inputs = [topics.inventory, topics.health, topics.operator, topics.events, topics.allocations]
    snapshots = settings.state_snapshots(
        state,
        topic=topics.snapshots(SERVICE),
        service=SERVICE,
        restore_topics=inputs,
        config=snapshot_config(state),
    )
    async with metrics.serve(settings):
        await restore_and_process(
            processor_settings(settings, SERVICE, [*inputs, topics.heartbeats]),
            state,
            handle,
            restore_topics=inputs,
            select=select_types(
                {
                    **dict.fromkeys(FOLDED_EVENTS, True),
                    "job.pending": True,
                    "job.checkpointed": True,
                    "node.heartbeat": state.awaits_deadline,
                }
            ),
            lock_topic=topics.inventory,
            end_batch=search,
            # Outputs name the batch and positions they were decided on (services/preemption/replay.py).
            record_inputs=True,
            metrics=metrics,
            # The state with the batch that wrote it; a restart loads the latest and reads only the tail.
            snapshots=snapshots,
        )


async def main_pools(settings: PreemptionSettings, layout: PoolLayout) -> None:
    """Preemption with pools: one seat per pool (services.common.pools); victims only in the pool's nodes,
    for the pool's waiting jobs (a gang never spans pools, so what would free room for it is in its pool)."""
    metrics = ServiceMetrics(SERVICE)
    topics = topic_names(settings)
    inputs = [topics.inventory, topics.health, topics.operator, topics.events, topics.allocations]
    home = home_pools(
        layout,
        group=settings.pool_group_names,
        instance_id=settings.instance_id,
        replicas=settings.pool_replicas,
    )
    watched: list[PreemptionState] = []

    async def run_seat(seat: Seat) -> None:
        state = new_state(settings)
        if not watched:
            watched.append(state)
            preemption_metrics.watch(metrics, state)

        def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
            return fold_event(envelope, state, now=datetime.now(UTC))

        def search(cause: str) -> Sequence[Outgoing]:
            return end_batch(state, now=datetime.now(UTC))

        base = processor_settings(settings, SERVICE, [*inputs, topics.heartbeats])
        await restore_and_process_seat(
            seat,
            base,
            state,
            handle,
            service=SERVICE,
            topics=topics,
            restore_topics=inputs,
            snapshots=settings,
            snapshot_config=snapshot_config(state),
            metrics=metrics,
            select=select_types(
                {
                    **dict.fromkeys(POOL_FOLDED_EVENTS, True),
                    "job.pending": True,
                    "job.checkpointed": True,
                    "node.heartbeat": state.awaits_deadline,
                }
            ),
            restore_select=select_types(
                {**dict.fromkeys(POOL_FOLDED_EVENTS, True), "job.pending": True, "job.checkpointed": True}
            ),
            end_batch=search,
        )

    async with metrics.serve(settings):
        await run_seats(seats(layout, home), run_seat, standby_delay_s=settings.pool_standby_delay_s)
