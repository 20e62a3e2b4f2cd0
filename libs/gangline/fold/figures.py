"""Counts read off the lifecycle fold for whoever watches the cluster (pure: no clock, no I/O).

Placement serves them as gauges (``gangline_jobs``, ``gangline_pending_jobs``, ``gangline_gpus``,
``gangline_fragmented_gpus``), computed from its own :class:`~gangline.fold.cluster.ClusterFold` at
scrape time: the same state it decides on, never a second fold.

* A job's state: ``running`` while it holds a live allocation, ``preempting`` when that allocation was
  asked to give its GPUs back (``job.preempting``), ``pending`` while it may be placed (cleared by quota,
  waiting for GPUs), ``waiting`` otherwise until it ends (admitted and held by quota, or between a
  preemption and its requeue).
* A pending job's reason: the code of the first reason placement last told it (``job.pending``),
  ``none`` before its first cycle.
* A GPU's state: ``cordoned`` when its node failed (until it registers again) or the GPU failed,
  ``degraded`` when marked so, ``allocated`` when a live grant holds it (or a slice of it), ``free``.
* Fragmented GPUs: the simulator's figure (:func:`gangline.sim.metrics.fragmentation_by_model`), free
  whole GPUs no waiting worker of that model fits on; 0 for a model nothing waits for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from gangline.core.model import GpuModel
from gangline.events.queues import QueueStatus
from gangline.events.types import JobId
from gangline.fold.cluster import ClusterFold
from gangline.sim.metrics import fragmentation_by_model, worker_need

JOB_STATES = ("waiting", "pending", "running", "preempting")
GPU_STATES = ("free", "allocated", "cordoned", "degraded")
NO_REASON = "none"


def jobs_by_state(fold: ClusterFold) -> Counter[tuple[str, str]]:
    """``(queue, state)`` → how many unfinished jobs are in that state (module docstring)."""
    asked = {victim for victims in fold.preemptors.values() for victim in victims}
    out: Counter[tuple[str, str]] = Counter()
    for record in fold.jobs.values():
        if record.spec is None or record.finished:
            continue
        live = record.live()
        if live is not None:
            state = "preempting" if (record.job_id, live.allocation_id) in asked else "running"
        elif record.job_id in fold.waiting:
            state = "pending"
        else:
            state = "waiting"
        out[(record.spec.queue, state)] += 1
    return out


def pending_by_reason(
    fold: ClusterFold, last_reasons: Mapping[JobId, tuple[str, ...]]
) -> Counter[tuple[str, str]]:
    """``(queue, reason code)`` → pending jobs, by the first reason each was last told.

    ``last_reasons``: per job, what placement last said (``code:message`` strings, as placement keeps them).
    """
    out: Counter[tuple[str, str]] = Counter()
    for job_id, record in fold.waiting.items():
        if record.spec is None:
            continue
        said = last_reasons.get(job_id)
        reason = said[0].split(":", 1)[0] if said else NO_REASON
        out[(record.spec.queue, reason)] += 1
    return out


def gpus_by_state(fold: ClusterFold) -> Counter[tuple[str, str]]:
    """``(gpu model, state)`` → GPUs of the registered nodes (module docstring)."""
    held: set[tuple[str, str]] = set()
    for record in fold.jobs.values():
        live = record.live()
        if live is not None:
            held.update((p.node, gpu) for p in live.placements for gpu in p.gpus)
    out: Counter[tuple[str, str]] = Counter()
    for node, registered in fold.nodes.items():
        if node in fold.refused:
            continue
        cordoned = fold.cordoned(node)
        failed = fold.failed_gpus.get(node, set())
        degraded = fold.degraded_gpus.get(node, set())
        for gpu in registered.gpus:
            if cordoned or gpu.id in failed:
                state = "cordoned"
            elif gpu.id in degraded:
                state = "degraded"
            elif (node, gpu.id) in held:
                state = "allocated"
            else:
                state = "free"
            out[(gpu.model, state)] += 1
    return out


def fragmented_gpus(fold: ClusterFold) -> dict[str, float]:
    """GPU model → free GPUs no waiting worker fits on (0 for models nothing waits for)."""
    needs = set()
    for record in fold.waiting.values():
        job = record.core()
        if job is not None:
            needs.add(worker_need(job.gpu_type, job.kind, job.gpus_per_worker, job.gpu_milli))
    if not needs:
        return {}
    waited_for = {need[0] for need in needs}
    cached = fold._snapshot
    snapshot = fold.snapshot()
    fold._snapshot = cached  # a scrape leaves the fold as it found it: it builds, it does not cache
    by_model = fragmentation_by_model(snapshot, needs)
    return {
        str(model): frag
        for model, (frag, _) in by_model.items()
        if None in waited_for or GpuModel(model) in waited_for
    }


def lent(statuses: Sequence[QueueStatus]) -> dict[tuple[str, str], float]:
    """``(queue, resource)`` → what the queue lends its tree, from the figures quota publishes for one tree.

    Not a ledger figure: the tree's borrowed units, per resource, are shared out among the queues that
    leave nominal quota idle, in proportion to what each leaves idle (so the tree's lent equals its
    borrowed). Quota serves it as ``gangline_quota_gpus{kind="lent"}``; the API reports it per queue."""
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
