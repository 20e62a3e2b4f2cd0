"""Placement's shell: restore the cluster and jobs from the log, then decide in Kafka transactions."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from gangline.bus import Outgoing, RecordMeta
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import load_profile_file
from gangline.core.pools import PoolLayout
from gangline.events.base import Envelope
from gangline.fold.cluster import FOLDED_EVENTS, POOL_FOLDED_EVENTS
from services.common.env import processor_settings, topic_names
from services.common.metrics import ServiceMetrics
from services.common.pools import Seat, home_pools, restore_and_process_seat, run_seats, seats
from services.common.queues import Queues, unlimited_queues
from services.common.select import or_resize_grants, select_types
from services.common.shell import restore_and_process
from services.placement import metrics as placement_metrics
from services.placement.handlers import (
    PlacementState,
    end_batch,
    fold_event,
    refused_registration,
)
from services.placement.settings import PlacementSettings

SERVICE = "placement"
log = logging.getLogger(__name__)


def new_state(settings: PlacementSettings, queues: Queues | None = None) -> PlacementState:
    profile = (
        load_profile_file(settings.profile_path, placement_registry())
        if settings.profile_path
        else default_profile()
    )
    return PlacementState(
        topics=topic_names(settings),
        profile=profile,
        gated=settings.gated,
        unlimited_queues=(
            frozenset(queues.unlimited) if queues is not None else unlimited_queues(settings.queues_file)
        ),
        max_jobs_per_cycle=settings.max_jobs_per_cycle,
    )


def snapshot_config(state: PlacementState) -> dict[str, object]:
    """The settings placement's fold depends on: a snapshot written under others is not loaded."""
    return {"gated": state.gated, "unlimited_queues": sorted(state.unlimited_queues)}


async def main(settings: PlacementSettings) -> None:
    layout = settings.pool_layout
    if layout is not None:
        await main_pools(settings, layout)
        return
    metrics = ServiceMetrics(SERVICE)
    state = new_state(settings)
    placement_metrics.watch(metrics, state)
    topics = state.topics

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        return fold_event(envelope, state, now=datetime.now(UTC))

    def cycle(cause: str) -> Sequence[Outgoing]:
        # One scheduling cycle per batch: every event of the poll is folded first.
        return end_batch(state, cause=cause, now=datetime.now(UTC))

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
            # Heartbeats are the clock: after a restart the first one starts a cycle even when all is quiet.
            processor_settings(settings, SERVICE, [*inputs, topics.heartbeats, topics.requests]),
            state,
            handle,
            restore_topics=inputs,
            # Placement writes the grants but a resize's: its own, read back while running, change nothing.
            select=or_resize_grants(
                select_types(
                    {
                        **dict.fromkeys(FOLDED_EVENTS, True),
                        "allocation.granted": False,
                        "job.cancel_requested": True,
                        "node.heartbeat": lambda: state.needs_cycle,
                    },
                    not_ours=frozenset({topics.requests}),
                )
            ),
            restore_select=select_types(dict.fromkeys(FOLDED_EVENTS, True)),
            lock_topic=topics.inventory,
            end_batch=cycle,
            # Outputs name the input positions they were decided on (replayed: services/placement/replay.py).
            record_inputs=True,
            # A registration placement rejects (node.rejected) goes to the dead-letter topic as well.
            refusal=refused_registration,
            metrics=metrics,
            # The state with the batch that wrote it; a restart loads the latest and reads only the tail.
            snapshots=snapshots,
        )


async def main_pools(settings: PlacementSettings, layout: PoolLayout) -> None:
    """Placement with pools: one seat per pool (services.common.pools), each a leader of its pool alone."""
    metrics = ServiceMetrics(SERVICE)
    topics = topic_names(settings)
    inputs = [topics.inventory, topics.health, topics.operator, topics.events, topics.allocations]
    home = home_pools(
        layout,
        group=settings.pool_group_names,
        instance_id=settings.instance_id,
        replicas=settings.pool_replicas,
    )
    every = seats(layout, home)
    watched: list[PlacementState] = []

    async def run_seat(seat: Seat) -> None:
        state = new_state(settings)
        if not watched:
            watched.append(state)
            placement_metrics.watch(metrics, state)

        def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
            return fold_event(envelope, state, now=datetime.now(UTC))

        def cycle(cause: str) -> Sequence[Outgoing]:
            return end_batch(state, cause=cause, now=datetime.now(UTC))

        base = processor_settings(settings, SERVICE, [*inputs, topics.heartbeats, topics.requests])
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
                    "allocation.granted": False,
                    "job.cancel_requested": True,
                    "node.heartbeat": lambda: state.needs_cycle,
                },
                not_ours=frozenset({topics.requests}),
            ),
            restore_select=select_types(dict.fromkeys(POOL_FOLDED_EVENTS, True)),
            end_batch=cycle,
            refusal=refused_registration,
        )

    log.info("placement pools", extra={"pools": str(layout), "home": sorted(home)})
    async with metrics.serve(settings):
        await run_seats(every, run_seat, standby_delay_s=settings.pool_standby_delay_s)
