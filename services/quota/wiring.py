"""Quota's shell: restore usage from the log, then gate admitted jobs in Kafka transactions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from gangline.bus import Outgoing, RecordMeta
from gangline.events.base import Envelope
from services.common.env import processor_settings, topic_names
from services.common.queues import Queues, load_queues
from services.common.select import select_types, unless_keyed_by
from services.common.shell import restore_and_process
from services.quota.handlers import QuotaState, decide
from services.quota.settings import QuotaSettings

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
RESTORE_EVENTS = (*QUOTA_EVENTS, "job.pending")
"""The restore also reads pending reasons: quota's own carry its preemption plans in flight."""


def new_state(settings: QuotaSettings, queues: Queues | None = None) -> QuotaState:
    """An empty state under ``settings``; ``queues`` when already read from ``settings.queues_file``."""
    return QuotaState(
        topics=topic_names(settings),
        queues=queues if queues is not None else load_queues(settings.queues_file),
        half_life_s=settings.fair_share_half_life_s,
    )


async def main(settings: QuotaSettings) -> None:
    state = new_state(settings)
    topics = state.topics

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        return decide(envelope, state, now=datetime.now(UTC))

    inputs = [topics.events, topics.allocations]
    # Both topics are keyed by job id; most of what quota reads is about finished jobs or jobs of
    # unlimited queues (retired at once), skipped undecoded.
    await restore_and_process(
        processor_settings(settings, SERVICE, inputs),
        state,
        handle,
        restore_topics=inputs,
        select=unless_keyed_by(state.retired, select_types(dict.fromkeys(QUOTA_EVENTS, True))),
        restore_select=unless_keyed_by(state.retired, select_types(dict.fromkeys(RESTORE_EVENTS, True))),
        lock_topic=topics.inventory,
        # Outputs name the batch and positions they were decided on: replayable (services/quota/replay.py).
        record_inputs=True,
    )
