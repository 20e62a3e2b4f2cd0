"""elastic: elastic gangs grow toward most workers on idle GPUs, shrink toward fewest when others wait.

Runs last in a cycle. When a job still waits for capacity (after allocate, backfill, preempt and
reclaim), running elastic jobs may give up their ranks beyond ``min_workers``: the victim search
treats each as a partial victim (only the dropped ranks are freed) and picks the cheapest minimal
set that lets the waiting job be placed; then each keeps as many of those ranks as the waiting job
leaves it (it shrinks only as far as needed, not to its fewest workers). Only elastic jobs of lower
priority than the waiting job, or whose queue borrows beyond its nominal quota, are shrunk — the
same rule as preemption. The decision is a `PreemptionPlan` of kind ``shrink`` (the elastic jobs
checkpoint and restart with ``keep_workers``) plus a `Resize` per shrunk job.

When nothing waits (no job of the cycle is left pending, not even on a reservation), each elastic
job below its most workers, lowest fair share first, is offered the idle GPUs: capped at what its
quota admits, on its GPU model, if a placement with more workers exists (its own GPUs count as
free), it gets a `Resize` to grow, through the same checkpoint-restart.

A shrink needs a cycle that may evict (``PreemptionPolicy.evict_in_cycle``: the simulator, the
preemption service's planner); a grow one that owns the idle GPUs (``grow_in_cycle``: the simulator,
placement). :mod:`gangline.core.resize` applies either.

Runs right after backfill and before preempt/reclaim in the fair profile, so a waiting job takes
ranks from elastic jobs before it stops anyone entirely.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from gangline.core.actions.preempt import blocked, max_attempts, placement_oracle
from gangline.core.actions.queueing import (
    PreemptionPlan,
    QueueContext,
    Resize,
    Victim,
    context_of,
    decisions_of,
    held_request,
)
from gangline.core.actions.victims import Place, VictimCandidate, find_victims, release, what_if
from gangline.core.framework.cycle import Session
from gangline.core.framework.state import Candidate
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import Allocation, GpuModel, Job, JobId
from gangline.core.queues import Resource, job_request
from gangline.core.snapshot import RunningJob, Snapshot

NAME = "elastic"


def _model_of(session: Session, r: RunningJob) -> GpuModel:
    snap = session.snapshot
    g = snap.gpu_pos[r.allocation.placements[0].gpus[0]]
    return GpuModel(snap.models[snap.g_model[g]])


def _dropped(session: Session, r: RunningJob, keep: int | None = None) -> dict[Resource, int]:
    """The quota an elastic job gives back when it shrinks to ``keep`` workers (None: its fewest)."""
    placed = len(r.allocation.placements)
    return job_request(
        r.job, _model_of(session, r), placed - (r.job.fewest_workers if keep is None else keep)
    )


def _shrinkable(session: Session, ctx: QueueContext, job: Job) -> list[VictimCandidate]:
    snap = session.snapshot
    out: list[VictimCandidate] = []
    for r in sorted(snap.running.values(), key=lambda r: r.job.id):
        placed = len(r.allocation.placements)
        if r.job.min_workers is None or placed <= r.job.fewest_workers:
            continue
        jid = r.job.id
        if jid in ctx.in_flight or jid in session.evicted or jid in session.placed:
            continue
        if ctx.runtime(jid) < ctx.policy.min_runtime_s:
            continue
        over = ctx.ledger.tree.has_queue(r.job.queue) and any(
            ctx.ledger.is_borrowing(r.job.queue, res) for res in held_request(snap, r)
        )
        if not (r.job.priority < job.priority or (over and r.job.queue != job.queue)):
            continue
        per_node: dict[int, int] = {}
        for p in r.allocation.placements[r.job.fewest_workers :]:
            if p.mig is None and p.milli is None:
                i = snap.node_pos[p.node]
                per_node[i] = per_node.get(i, 0) + len(p.gpus)
        gpus = sum(len(p.gpus) for p in r.allocation.placements)
        out.append(
            VictimCandidate(
                job_id=jid,
                lost_gpu_hours=ctx.lost_hours(jid) * gpus,
                gpus_by_node=tuple(sorted(per_node.items())),
                gpus=sum(per_node.values()),
                rank=(r.job.priority,),
                keep_workers=r.job.fewest_workers,
            )
        )
    return out


def _fewest_dropped(
    snap: Snapshot,
    job: Job,
    victims: list[VictimCandidate],
    placement: Candidate,
    place: Place,
    admits: Callable[[Mapping[JobId, int | None], Candidate], bool],
) -> tuple[list[VictimCandidate], Candidate]:
    """The victims shrunk only as far as the waiting job needs, and its placement then.

    The search frees every rank beyond each victim's fewest workers; in turn, each victim keeps as
    many of those (from its first) as still leave ``job`` a placement its quota admits, the others
    shrunk as decided so far. So a shrink frees the ranks ``job`` takes, not ranks left idle.
    """
    for i, v in enumerate(victims):
        placed = len(snap.running[v.job_id].allocation.placements)
        least = v.keep_workers if v.keep_workers is not None else placed
        for keep in range(placed - 1, least, -1):
            tried = [*victims[:i], replace(v, keep_workers=keep), *victims[i + 1 :]]
            with what_if(snap):
                for t in tried:
                    release(snap, t)
                got = place(job)
            if got is not None and admits({t.job_id: t.keep_workers for t in tried}, got):
                victims, placement = tried, got
                break
    return victims, placement


def _anyone_waits(session: Session) -> bool:
    """Whether a job of the cycle is left waiting for room (a reservation's wait included): idle GPUs
    go to waiting work before any elastic job grows into them."""
    return any(p.code not in (StatusCode.UNRESOLVABLE, StatusCode.ERROR) for p in session.pending.values())


class Elastic:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        self.max_preemptors = max_attempts(args)

    def execute(self, session: Session) -> None:
        ctx = context_of(session)
        waiting = blocked(session, ctx, self.max_preemptors)
        if waiting:
            if ctx.policy.evict_in_cycle:  # a shrink takes GPUs from running work for a waiting job
                for job in waiting:
                    self._shrink_for(session, ctx, job)
        elif ctx.policy.grow_in_cycle and not _anyone_waits(session):
            self._grow(session, ctx)

    def _shrink_for(self, session: Session, ctx: QueueContext, job: Job) -> None:
        snap = session.snapshot
        candidates = _shrinkable(session, ctx, job)
        if not candidates:
            return

        running = dict(snap.running)  # shrunk jobs stay running; whole victims would not

        def admits_kept(keeps: Mapping[JobId, int | None], c: Candidate) -> bool:
            ledger = ctx.ledger.copy()
            for jid, keep in sorted(keeps.items()):
                r = running[jid]
                ledger.release(r.job.queue, _dropped(session, r, keep))
            return ledger.fits(job.queue, job_request(job, snap.models[c.model], len(c.slots)))

        def admits(ids: frozenset[JobId], c: Candidate) -> bool:
            return admits_kept(dict.fromkeys(ids), c)

        place = placement_oracle(session)
        found = find_victims(snap, job, candidates, place, admissible=admits)
        if found is None:
            return
        chosen, placement = _fewest_dropped(
            snap, job, list(found.victims), found.placement, place, admits_kept
        )
        decisions = decisions_of(session)
        victims: list[Victim] = []
        for v in chosen:
            r = snap.running[v.job_id]
            keep = v.keep_workers if v.keep_workers is not None else r.job.fewest_workers
            deadline = ctx.now + ctx.grace(r.job)
            dropped = _dropped(session, r, keep)
            ctx.ledger.release(r.job.queue, dropped)
            ctx.fair.uncharge(r.job.queue, dropped)
            victims.append(
                Victim(
                    job_id=v.job_id,
                    queue=r.job.queue,
                    priority=r.job.priority,
                    gpus=sum(len(p.gpus) for p in r.allocation.placements[keep:]),
                    lost_gpu_hours=round(v.lost_gpu_hours, 6),
                    checkpoint_deadline=deadline,
                    reason=f"elastic {v.job_id} shrinks to {keep} worker(s) for waiting {job.id}",
                    keep_workers=keep,
                )
            )
            decisions.resizes.append(
                Resize(v.job_id, len(r.allocation.placements), keep, r.allocation.placements[:keep], deadline)
            )
            release(snap, v)
        for s in placement.slots:
            snap.take(job, s)
        req = job_request(job, snap.models[placement.model], len(placement.slots))
        ctx.ledger.admit(job.queue, req)
        ctx.fair.charge(job.queue, req)
        ready = max(v.checkpoint_deadline for v in victims)
        decisions.add_plan(
            PreemptionPlan(
                preemptor=job.id,
                kind="shrink",
                victims=tuple(victims),
                reservation=tuple(snap.placement_of(k, s) for k, s in enumerate(placement.slots)),
                ready_at=ready,
            )
        )
        sentence = f"waiting for {len(victims)} elastic job(s) to shrink; GPUs reserved for it by t={ready:g}"
        decisions.explain(job.id, sentence)
        session.pend(job, Status(StatusCode.WAIT, (Reason(ReasonCode.PRIORITY, NAME, sentence),)))

    def _grow(self, session: Session, ctx: QueueContext) -> None:
        snap = session.snapshot
        place = placement_oracle(session)
        growable = [
            r
            for r in snap.running.values()
            if r.job.min_workers is not None
            and len(r.allocation.placements) < r.job.workers
            and r.job.id not in ctx.in_flight
            and r.job.id not in session.evicted
            and r.job.id not in session.placed
            and ctx.ledger.tree.has_queue(r.job.queue)
        ]
        growable.sort(key=lambda r: (ctx.fair.share(r.job.queue), r.job.id))
        decisions = decisions_of(session)
        for r in growable:
            current = len(r.allocation.placements)
            held = held_request(snap, r)
            ledger = ctx.ledger.copy()
            ledger.release(r.job.queue, held)
            model = _model_of(session, r)
            most = current
            while most < r.job.workers and ledger.fits(r.job.queue, job_request(r.job, model, most + 1)):
                most += 1
            if most <= current:
                continue
            wanted = replace(r.job, workers=most, gpu_type=model, min_workers=min(current + 1, most))
            with what_if(snap):
                snap.release(r.job.id)
                got = place(wanted)
            if got is None or len(got.slots) <= current:
                continue
            new = job_request(r.job, snap.models[got.model], len(got.slots))
            if not ledger.fits(r.job.queue, new):
                continue
            ctx.ledger.release(r.job.queue, held)
            ctx.ledger.admit(r.job.queue, new)
            ctx.fair.uncharge(r.job.queue, held)
            ctx.fair.charge(r.job.queue, new)
            snap.release(r.job.id)
            for s in got.slots:
                snap.take(r.job, s)
            placements = tuple(snap.placement_of(k, s) for k, s in enumerate(got.slots))
            snap.record_running(
                r.job, Allocation(session.allocation_id(r.job.id, session.cycle), r.job.id, placements)
            )
            deadline = ctx.now + ctx.grace(r.job)
            decisions.resizes.append(Resize(r.job.id, current, len(got.slots), placements, deadline))
            decisions.explain(r.job.id, f"grows from {current} to {len(got.slots)} workers on idle GPUs")
