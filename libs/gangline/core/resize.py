"""Carrying out an elastic resize: a running job's allocation replaced by one at its new size (pure).

The elastic action (:mod:`gangline.core.actions.elastic`) decides a
:class:`~gangline.core.actions.queueing.Resize` in its cycle's working snapshot, which the cycle
leaves as it was. Whoever applies it replaces the job's allocation with one at ``Resize.placements``
through :func:`apply_resize`: the core's simulator at once; the services once the job checkpointed
(``job.resizing``, then ``allocation.released`` reason ``resized`` and ``allocation.granted`` with
``resizes``, one transaction). So the GPUs a shrink frees and those a grow takes are the core's choice.

Between the two a GPU a grow is to take may fail, or its node be cordoned: :func:`grow_falls_back`
says when the resize is granted the job's current placements instead (it goes on at its old size).
"""

from __future__ import annotations

from collections.abc import Sequence

from gangline.core.actions.queueing import Resize
from gangline.core.model import Allocation, AllocationId, WorkerPlacement
from gangline.core.snapshot import RunningJob, Snapshot


def may_grow(running: RunningJob) -> bool:
    """Whether an elastic job runs below its most workers (idle GPUs could grow it)."""
    job = running.job
    return job.min_workers is not None and len(running.allocation.placements) < job.workers


def grow_falls_back(snapshot: Snapshot, current: Allocation, placements: Sequence[WorkerPlacement]) -> bool:
    """Whether a resize from ``current`` to ``placements`` is granted ``current``'s placements instead.

    So it is when a GPU ``placements`` adds to ``current`` takes no work in ``snapshot`` by now (failed
    or degraded, its node failed or cordoned, or not in the cluster): the job goes on at its old size,
    and a later cycle may grow it elsewhere. A shrink adds no GPU, so it never falls back.
    """
    own = {g for p in current.placements for g in p.gpus}
    for p in placements:
        for gpu in p.gpus:
            if gpu in own:
                continue
            g = snapshot.gpu_pos.get(gpu)
            if g is None or not snapshot.g_usable[g]:
                return True
    return False


def apply_resize(snapshot: Snapshot, resize: Resize, allocation_id: AllocationId) -> Allocation | None:
    """Replace the job's allocation in ``snapshot`` with ``allocation_id`` at the resize's placements.

    All or nothing: None (and the snapshot as it was) when the job no longer runs at the size the
    resize was decided for, or when a GPU it would take is held by another job by now. A grow that
    falls back (:func:`grow_falls_back`) is granted at the job's current placements.
    """
    running = snapshot.running.get(resize.job_id)
    if running is None or len(running.allocation.placements) != resize.from_workers:
        return None
    placements = resize.placements
    if grow_falls_back(snapshot, running.allocation, placements):
        placements = running.allocation.placements
    snapshot.release(resize.job_id)
    allocation = Allocation(allocation_id, resize.job_id, placements)
    if snapshot.grant(running.job, allocation).ok:
        return allocation
    restored = snapshot.grant(running.job, running.allocation)
    assert restored.ok, restored.message
    return None
