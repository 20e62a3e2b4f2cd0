"""Carrying out an elastic resize: a running job's allocation replaced by one at its new size (pure).

The elastic action (:mod:`gangline.core.actions.elastic`) decides a
:class:`~gangline.core.actions.queueing.Resize` in its cycle's working snapshot, which the cycle
leaves as it was. Whoever applies it replaces the job's allocation with one at ``Resize.placements``
through :func:`apply_resize`: the core's simulator at once; the services once the job checkpointed
(``job.resizing``, then ``allocation.released`` reason ``resized`` and ``allocation.granted`` with
``resizes``, one transaction). So the GPUs a shrink frees and those a grow takes are the core's choice.
"""

from __future__ import annotations

from gangline.core.actions.queueing import Resize
from gangline.core.model import Allocation, AllocationId
from gangline.core.snapshot import RunningJob, Snapshot


def may_grow(running: RunningJob) -> bool:
    """Whether an elastic job runs below its most workers (idle GPUs could grow it)."""
    job = running.job
    return job.min_workers is not None and len(running.allocation.placements) < job.workers


def apply_resize(snapshot: Snapshot, resize: Resize, allocation_id: AllocationId) -> Allocation | None:
    """Replace the job's allocation in ``snapshot`` with ``allocation_id`` at the resize's placements.

    All or nothing: None (and the snapshot as it was) when the job no longer runs at the size the
    resize was decided for, or when a GPU it would take is held by another job by now.
    """
    running = snapshot.running.get(resize.job_id)
    if running is None or len(running.allocation.placements) != resize.from_workers:
        return None
    snapshot.release(resize.job_id)
    allocation = Allocation(allocation_id, resize.job_id, resize.placements)
    if snapshot.grant(running.job, allocation).ok:
        return allocation
    restored = snapshot.grant(running.job, running.allocation)
    assert restored.ok, restored.message
    return None
