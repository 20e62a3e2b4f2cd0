"""Preemption's counters: victims asked to give their GPUs back, and the GPU-hours their preemption lost."""

from __future__ import annotations

from collections.abc import Sequence

from gangline.bus import Outgoing
from gangline.events.jobs import JobPreempted, JobPreempting
from gangline.events.types import JobId
from gangline.telemetry.metrics import counting
from services.common.metrics import ServiceMetrics
from services.preemption.handlers import PreemptionState, preemption_reason

UNKNOWN_QUEUE = "unknown"


def watch(metrics: ServiceMetrics, state: PreemptionState) -> None:
    """Count each ``job.preempting`` by the victim's queue and why, and each ``job.preempted``'s loss."""
    preemptions = counting(metrics.registry, "gangline_preemptions_total")
    lost = counting(metrics.registry, "gangline_gpu_hours_lost_total")

    def queue_of(job_id: str) -> str:
        record = state.mirror.jobs.get(JobId(job_id))
        return record.spec.queue if record is not None and record.spec is not None else UNKNOWN_QUEUE

    def observe(outputs: Sequence[Outgoing]) -> None:
        for _, envelope in outputs:
            data = envelope.data
            if isinstance(data, JobPreempting):
                preemptions.labels(queue_of(data.job_id), preemption_reason(data)).inc()
            elif isinstance(data, JobPreempted):  # a checkpointed one lost nothing, counted as such
                lost.labels(queue_of(data.job_id)).inc(data.lost_gpu_seconds / 3600)

    metrics.on_decided(observe)
