"""Admission's shell: restore from the log, then decide each request in a Kafka transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from gangline.bus import DeadLetter, Outgoing, RecordMeta
from gangline.events.base import Envelope
from services.admission.handlers import AdmissionState, on_request, rejection_of_dead_letter
from services.admission.settings import AdmissionSettings
from services.common.env import processor_settings, topic_names
from services.common.metrics import ServiceMetrics
from services.common.queues import Queues, load_queues
from services.common.shell import restore_and_process

SERVICE = "admission"


def new_state(settings: AdmissionSettings, queues: Queues | None = None) -> AdmissionState:
    """An empty state; ``queues`` read from ``settings.queues_file`` unless given (read once per run)."""
    return AdmissionState(
        topics=topic_names(settings),
        queues=queues if queues is not None else load_queues(settings.queues_file),
    )


async def main(settings: AdmissionSettings) -> None:
    metrics = ServiceMetrics(SERVICE)
    state = new_state(settings)
    topics = state.topics

    def decide(envelope: Envelope, meta: RecordMeta) -> Sequence[Outgoing]:
        return on_request(envelope, state, now=datetime.now(UTC))

    def reject_unreadable(letter: DeadLetter) -> Sequence[Outgoing]:
        return rejection_of_dead_letter(letter, state, now=datetime.now(UTC))

    async with metrics.serve(settings):
        await restore_and_process(
            processor_settings(settings, SERVICE, [topics.requests, topics.inventory]),
            state,
            decide,
            restore_topics=[topics.inventory, topics.events],
            dead_letter_outputs=reject_unreadable,
            # Outputs name the batch and positions they were decided on (services/admission/replay.py).
            record_inputs=True,
            metrics=metrics,
        )
