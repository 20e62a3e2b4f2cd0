"""gang: all workers or none; elastic jobs take between their fewest and most workers.

pre_filter: a gang bigger than the cluster (or a worker bigger than any node) is unresolvable;
a gang bigger than what is free waits with a CAPACITY reason. score prefers more workers for
elastic jobs. permit refuses any candidate outside [fewest, workers] — the last guard against a
partial gang.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.framework.state import Candidate, CycleState
from gangline.core.framework.status import ReasonCode, Status
from gangline.core.model import GpuMode, Job
from gangline.core.snapshot import most_over

NAME = "gang"


class Gang:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def pre_filter(self, state: CycleState, job: Job) -> Status:
        """Size checks against the whole cluster and what is free."""
        if job.kind is not GpuMode.WHOLE:
            return Status.success()
        snap = state.snapshot
        g, fewest = job.gpus_per_worker, job.fewest_workers
        need = fewest * g
        if g > snap.max_per_node:
            return Status.unresolvable(
                f"a worker needs {g} GPUs on one node; the largest node has {snap.max_per_node}",
                plugin=NAME,
                code=ReasonCode.GANG_SIZE,
                details={"gpus_per_worker": g, "largest_node": snap.max_per_node},
            )
        capacity = most_over(snap.capacity, state.models)
        if need > capacity:
            return Status.unresolvable(
                f"gang needs {need} GPUs; the cluster has {capacity} matching GPUs in all",
                plugin=NAME,
                code=ReasonCode.GANG_SIZE,
                details={"needed": need, "capacity": capacity},
            )
        free = most_over(snap.total_free, state.models)
        if need > free:
            return Status.unschedulable(
                f"gang needs {need} GPUs ({fewest} x {g}); {free} matching GPUs are free",
                plugin=NAME,
                code=ReasonCode.CAPACITY,
                details={"needed": need, "free": free},
            )
        return Status.success()

    def score(self, state: CycleState, job: Job, candidate: Candidate) -> int:
        """100 at the full worker count, proportionally less for a smaller elastic gang."""
        return 100 * len(candidate.slots) // job.workers

    def permit(self, state: CycleState, job: Job, candidate: Candidate) -> Status:
        """Whole gangs only."""
        n = len(candidate.slots)
        if job.fewest_workers <= n <= job.workers:
            return Status.success()
        return Status.unschedulable(
            f"candidate has {n} workers; the gang needs {job.fewest_workers}..{job.workers}",
            plugin=NAME,
            code=ReasonCode.GANG_SIZE,
        )
