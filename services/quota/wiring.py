"""Quota's shell: restore usage from the log, then gate admitted jobs in Kafka transactions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from gangline.bus import Outgoing, RecordMeta
from gangline.events.base import Envelope
from services.common.env import processor_settings, topic_names
from services.common.select import select_types
from services.common.shell import restore_and_process
from services.quota.handlers import QuotaState, decide
from services.quota.settings import QuotaSettings

SERVICE = "quota"
QUOTA_EVENTS = ("job.admitted", "job.queued", "job.requeued", "job.failed", "allocation.released")


def new_state(settings: QuotaSettings) -> QuotaState:
    return QuotaState(topics=topic_names(settings), limits=dict(settings.queue_limits))


async def main(settings: QuotaSettings) -> None:
    state = new_state(settings)
    topics = state.topics

    def handle(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        return decide(envelope, state, now=datetime.now(UTC))

    inputs = [topics.events, topics.allocations]
    await restore_and_process(
        processor_settings(settings, SERVICE, inputs),
        state,
        handle,
        restore_topics=inputs,
        select=select_types(dict.fromkeys(QUOTA_EVENTS, True)),
        lock_topic=topics.inventory,
        # Outputs name the batch and positions they were decided on: replayable (services/quota/replay.py).
        record_inputs=True,
    )
