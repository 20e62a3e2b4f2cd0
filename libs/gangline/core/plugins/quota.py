"""quota: a job runs only within its queue's quota plus what its cohort may lend it.

pre_filter: a job that got a preemption plan earlier in this cycle waits (WAIT) for its victims;
otherwise it keeps the GPU models the queue can afford for the job's fewest workers (a job with
no GPU type may land on any model its quota covers, like Kueue's flavours); when none, the job
waits with a QUOTA reason: "team-a uses 48 of its 48 H100; cohort has 0 to lend; needs 8".
reserve: charges the chosen candidate (its model and worker count) to the cycle's ledger and fair
share, refusing when an elastic gang's extra workers would go over; unreserve undoes exactly that.

Needs the `QueueContext` (see `gangline.core.actions.queueing`); without it the plugin
lets everything through, so cycles without queue facts run unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.actions.queueing import DECISIONS, QUEUES, QueueContext
from gangline.core.framework.state import Candidate, CycleState
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import Job
from gangline.core.queues import job_request

NAME = "quota"


class Quota:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def pre_filter(self, state: CycleState, job: Job) -> Status:
        """Narrow `state.models` to the models the queue can afford; QUOTA reason when none."""
        ctx: QueueContext | None = state.read_shared(QUEUES)
        if ctx is None:
            return Status.success()
        decisions = state.read_shared(DECISIONS)
        if decisions is not None and job.id in decisions.planned:
            # It holds a reservation and waits for its victims; placing it elsewhere would double-book.
            return Status(
                StatusCode.WAIT, (Reason(ReasonCode.PRIORITY, NAME, "waiting for its victims to checkpoint"),)
            )
        snap = state.snapshot
        if not ctx.ledger.tree.has_queue(job.queue):
            return Status.unresolvable(
                f"queue {job.queue} does not exist", plugin=NAME, code=ReasonCode.QUOTA
            )
        affordable: list[int] = []
        first_reason = ""
        for m in state.models:
            check = ctx.ledger.check(job.queue, job_request(job, snap.models[m], job.fewest_workers))
            if check.fits:
                affordable.append(m)
            elif not first_reason:
                first_reason = check.reason
        if affordable:
            state.models = tuple(affordable)
            return Status.success()
        return Status.unschedulable(
            first_reason or f"queue {job.queue} has no quota for the GPU models this job can use",
            plugin=NAME,
            code=ReasonCode.QUOTA,
            details={"queue": job.queue},
        )

    def reserve(self, state: CycleState, job: Job, candidate: Candidate) -> Status:
        """Charge the candidate to the ledger and the fair share."""
        ctx: QueueContext | None = state.read_shared(QUEUES)
        if ctx is None:
            return Status.success()
        req = job_request(job, state.snapshot.models[candidate.model], len(candidate.slots))
        check = ctx.ledger.check(job.queue, req)
        if not check.fits:
            return Status.unschedulable(check.reason, plugin=NAME, code=ReasonCode.QUOTA)
        ctx.ledger.admit(job.queue, req)
        ctx.fair.charge(job.queue, req)
        return Status.success()

    def unreserve(self, state: CycleState, job: Job, candidate: Candidate) -> None:
        """Undo `reserve`."""
        ctx: QueueContext | None = state.read_shared(QUEUES)
        if ctx is None:
            return
        req = job_request(job, state.snapshot.models[candidate.model], len(candidate.slots))
        ctx.ledger.release(job.queue, req)
        ctx.fair.uncharge(job.queue, req)
