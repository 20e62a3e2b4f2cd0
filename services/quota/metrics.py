"""Quota's gauges, from its ledger and fair-share figure at scrape time, and its admission-wait histogram.

``gangline_quota_gpus`` and ``gangline_fair_share`` are :func:`services.quota.status.status_of` (the
figures quota publishes on queues.status), taken now rather than at its throttled publications. ``lent``
is not a ledger figure: a tree's borrowed units, per resource, are shared out among the queues that
leave nominal quota idle, in proportion to what each leaves idle (so the tree's lent equals its borrowed).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from prometheus_client.core import Metric

from gangline.events.jobs import JobQueued
from gangline.events.queues import QueueStatus
from gangline.telemetry.metrics import gauge
from services.common.metrics import ServiceMetrics
from services.quota.handlers import QuotaState
from services.quota.status import status_of, trees


def lent(statuses: Sequence[QueueStatus]) -> dict[tuple[str, str], float]:
    """``(queue, resource)`` → what the queue lends its tree (module docstring)."""
    out: dict[tuple[str, str], float] = {}
    resources = sorted({r for status in statuses for r in status.resources})
    for resource in resources:
        borrowed = sum(s.resources[resource].borrowed for s in statuses if resource in s.resources)
        idle = {
            s.queue: max(0, s.resources[resource].nominal - s.resources[resource].used)
            for s in statuses
            if resource in s.resources
        }
        total_idle = sum(idle.values())
        for queue, spare in idle.items():
            out[(queue, resource)] = borrowed * spare / total_idle if total_idle else 0.0
    return out


def quota_figures(state: QuotaState, now: datetime) -> list[Metric]:
    """Nominal, used, borrowed and lent per queue and resource, and each queue's fair share, as of ``now``."""
    quota = gauge("gangline_quota_gpus")
    share = gauge("gangline_fair_share")
    for cohort, queues in trees(state).items():
        fair = state.fair_share((True, cohort), now)
        statuses = [status_of(state, fair, queue, cohort, now) for queue in queues]
        lends = lent(statuses)
        for status in statuses:
            share.add_metric([status.queue], status.dominant_share)
            for resource, figures in status.resources.items():
                quota.add_metric([status.queue, resource, "nominal"], figures.nominal)
                quota.add_metric([status.queue, resource, "used"], figures.used)
                quota.add_metric([status.queue, resource, "borrowed"], figures.borrowed)
                quota.add_metric([status.queue, resource, "lent"], lends.get((status.queue, resource), 0.0))
    return [quota, share]


def watch(metrics: ServiceMetrics, state: QuotaState) -> None:
    """Serve the quota gauges and time each job's first ``job.queued`` from its admission."""
    metrics.add_figures(lambda: quota_figures(state, datetime.now(UTC)))

    def admitted_at(queued: JobQueued) -> datetime | None:
        job = state.jobs.get(queued.job_id)
        # A requeued job is queued again: its first admission is the wait that counts.
        return job.admitted_at if job is not None and len(job.queued) <= 1 else None

    metrics.first_waits("gangline_admission_wait_seconds", JobQueued, admitted_at)
