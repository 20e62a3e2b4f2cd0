"""Placement's gauges, read off its fold at scrape time, and its request-to-grant histogram."""

from __future__ import annotations

from datetime import datetime

from prometheus_client.core import Metric

from gangline.events.allocations import AllocationGranted
from gangline.fold.figures import (
    GPU_STATES,
    JOB_STATES,
    fragmented_gpus,
    gpus_by_state,
    jobs_by_state,
    pending_by_reason,
)
from gangline.telemetry.metrics import gauge
from services.common.metrics import ServiceMetrics
from services.placement.handlers import PlacementState


def cluster_figures(state: PlacementState) -> list[Metric]:
    """Jobs by state, pending jobs by reason, GPUs by state and fragmented GPUs (every state listed)."""
    jobs = gauge("gangline_jobs")
    counted = jobs_by_state(state)
    for queue in sorted({queue for queue, _ in counted}):
        for job_state in JOB_STATES:
            jobs.add_metric([queue, job_state], counted[(queue, job_state)])
    pending = gauge("gangline_pending_jobs")
    for (queue, reason), n in sorted(pending_by_reason(state, state.last_pending).items()):
        pending.add_metric([queue, reason], n)
    gpus = gauge("gangline_gpus")
    by_state = gpus_by_state(state)
    models = sorted({model for model, _ in by_state})
    for model in models:
        for gpu_state in GPU_STATES:
            gpus.add_metric([model, gpu_state], by_state[(model, gpu_state)])
    fragmented = gauge("gangline_fragmented_gpus")
    stranded = fragmented_gpus(state)
    for model in models:
        fragmented.add_metric([model], stranded.get(model, 0.0))
    return [jobs, pending, gpus, fragmented]


def watch(metrics: ServiceMetrics, state: PlacementState) -> None:
    """Serve the cluster's gauges and time each job's first grant from its admission."""
    metrics.add_figures(lambda: cluster_figures(state))

    def admitted_at(granted: AllocationGranted) -> datetime | None:
        record = state.jobs.get(granted.job_id)
        return record.admitted_at if record is not None and len(record.grants) <= 1 else None

    metrics.first_waits("gangline_request_to_grant_seconds", AllocationGranted, admitted_at)
