"""reclaim: a queue below its nominal quota takes back GPUs its cohort lent to borrowers.

For each job still pending after allocate whose queue would stay within its nominal quota if it
ran (it is owed these GPUs), victims may be only running jobs of *other* queues in the same cohort
tree that are borrowing the resource, preemptible, past the minimum runtime (and, with
``reclaim_lower_priority_only``, of lower priority). A victim set is admissible only if every
victim's queue keeps at least its nominal quota once its victims are gone: reclaim takes back
only what was borrowed, never what a queue is owed. (Stricter than Kueue, which may take a whole
job that straddles the nominal line; here the waiting job waits for borrowers to end instead.)
The plan is built and committed like preempt's (see `preempt.commit_plan`).

This is the research lab's rule: no queue keeps GPUs beyond its quota while another queue with
unused nominal quota waits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gangline.core.actions.preempt import (
    commit_plan,
    max_attempts,
    may_be_victim,
    preemptors,
    search_victims,
)
from gangline.core.actions.queueing import QueueContext, context_of, held_request, request_for_order
from gangline.core.framework.cycle import Session
from gangline.core.model import Job, JobId, QueueName
from gangline.core.queues import Resource
from gangline.core.snapshot import RunningJob

NAME = "reclaim"


def _keeps_nominal(session: Session, ctx: QueueContext) -> Callable[[frozenset[JobId]], bool]:
    """Every victim's queue still holds at least its nominal quota once its victims are gone."""
    snap = session.snapshot
    tree = ctx.ledger.tree
    running = dict(snap.running)  # the victims are released while this is called

    def ok(ids: frozenset[JobId]) -> bool:
        taken: dict[tuple[QueueName, Resource], int] = {}
        for jid in ids:
            r = running[jid]
            for res, n in held_request(snap, r).items():
                key = (r.job.queue, res)
                taken[key] = taken.get(key, 0) + n
        return all(ctx.ledger.usage(q, res) - n >= tree.nominal(q, res) for (q, res), n in taken.items())

    return ok


class Reclaim:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        self.max_preemptors = max_attempts(args)

    def execute(self, session: Session) -> None:
        ctx = context_of(session)
        tree = ctx.ledger.tree
        snap = session.snapshot
        blocked = [
            j
            for j in preemptors(session, ctx, None)
            if tree.has_queue(j.queue) and ctx.ledger.within_nominal(j.queue, request_for_order(j, snap))
        ][: self.max_preemptors]
        if not blocked:
            return
        lenders = [
            snap.running[jid]
            for jid in sorted(snap.running)
            if snap.running[jid].job.preemptible and tree.has_queue(snap.running[jid].job.queue)
        ]
        for job in blocked:
            eligible = self._eligible(session, ctx, job, lenders)
            if not eligible:
                continue
            found = search_victims(session, ctx, job, eligible, _keeps_nominal(session, ctx))
            if found is None:
                continue
            why: dict[JobId, str] = {}
            for v in found.victims:
                r = snap.running[v.job_id]
                res = next(iter(held_request(snap, r)), None)
                borrowed = ctx.ledger.borrowed(r.job.queue, res) if res is not None else 0
                why[v.job_id] = (
                    f"queue {r.job.queue} borrows {borrowed} {res} beyond its nominal quota; "
                    f"reclaimed by {job.queue} (below its nominal quota) for {job.id}"
                )
            commit_plan(session, ctx, job, found, NAME, why)

    def _eligible(
        self, session: Session, ctx: QueueContext, job: Job, lenders: list[RunningJob]
    ) -> list[RunningJob]:
        tree = ctx.ledger.tree
        out: list[RunningJob] = []
        for r in lenders:
            q = r.job.queue
            if q == job.queue or not tree.same_tree(q, job.queue):
                continue
            if ctx.policy.reclaim_lower_priority_only and r.job.priority >= job.priority:
                continue
            if not may_be_victim(r, ctx, session):
                continue
            held = held_request(session.snapshot, r)
            # Only a job within what its queue borrows: one whose release alone takes the queue below
            # its nominal quota is in no admissible set (more victims only lower the usage), and
            # left in, the search's cost order would add it before the borrowers that do qualify.
            if any(ctx.ledger.is_borrowing(q, res) for res in held) and all(
                ctx.ledger.usage(q, res) - n >= tree.nominal(q, res) for res, n in held.items()
            ):
                out.append(r)
        return out
