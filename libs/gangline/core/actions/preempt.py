"""preempt: a higher-priority job that cannot be placed takes GPUs from lower-priority work of its queue.

For each job still pending after allocate (in session order), the victims may be only running
jobs of the same queue with a strictly lower priority, preemptible, past the policy's minimum
runtime and not already being checkpointed. `find_victims_in` picks the cheapest minimal set whose
release lets the job really be placed (gang, topology and type included) and keeps its queue within
quota. The decision is a `PreemptionPlan`: the victims are evicted in the plan with their
checkpoint deadlines, and the preemptor's placement is held in the working snapshot (so nothing
later in the cycle takes it) and reported as its reservation; the preemptor itself stays pending,
"waiting for N job(s) to checkpoint", until the victims are gone.

Shared with reclaim: `placement_oracle`, `search_victims`, `commit_plan`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gangline.core.actions.allocate import choose
from gangline.core.actions.queueing import (
    PreemptionPlan,
    QueueContext,
    Victim,
    context_of,
    decisions_of,
    held_request,
)
from gangline.core.actions.victims import NodeGpus, Place, VictimPool, VictimSet, WholeJob, find_victims_in
from gangline.core.framework.cycle import Session
from gangline.core.framework.state import Candidate
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import FULL_GPU_MILLI, GpuMode, GpuModel, Job, JobId, QueueName, WorkerPlacement
from gangline.core.placement import search, whole_workers_fit
from gangline.core.queues import job_request
from gangline.core.snapshot import RunningJob, Snapshot

NAME = "preempt"
QUOTA_PLUGIN = "quota"
MAX_HELD_PLANNED = 16
"""Jobs the quota gate holds that one planning cycle looks at (:func:`held_to_plan`): each costs the
cycle a placement attempt, and the victim search runs for the first few blocked jobs only."""


@dataclass(frozen=True, slots=True)
class HeldJob:
    """A job the quota gate holds, as preemption planning reads it: the GPU model quota would charge it
    to (None: the job's own), whether its queue is owed the quota it waits for (reclaim), and when it
    was admitted."""

    job: Job
    gpu_type: GpuModel | None
    owed: bool
    admitted_at: float

    def on_model(self) -> Job:
        """The job as planned for: on the model quota would charge it to, when it names none."""
        if self.job.gpu_type is not None or self.gpu_type is None:
            return self.job
        return replace(self.job, gpu_type=self.gpu_type)


def lowest_preemptible_priority(snapshot: Snapshot) -> dict[QueueName, int]:
    """Per queue, the lowest priority of its running preemptible jobs (which held jobs may outrank)."""
    lowest: dict[QueueName, int] = {}
    for running in snapshot.running.values():
        job = running.job
        if job.preemptible:
            lowest[job.queue] = min(job.priority, lowest.get(job.queue, job.priority))
    return lowest


def held_to_plan(held: Iterable[HeldJob], snapshot: Snapshot, limit: int = MAX_HELD_PLANNED) -> list[Job]:
    """The held jobs preempt or reclaim may help, the first ``limit`` of them: those owed their nominal
    quota (reclaim takes back what the cohort lent) first, then those that outrank preemptible work of
    their own queue (priority preemption); by priority, then admitted earliest, then job id. A job
    neither owed nor outranking anything of its queue is left out: no victim could be chosen for it."""
    outranks = lowest_preemptible_priority(snapshot)
    worth = [h for h in held if h.owed or h.job.priority > outranks.get(h.job.queue, h.job.priority)]
    worth.sort(key=lambda h: (not h.owed, -h.job.priority, h.admitted_at, h.job.id))
    return [h.on_model() for h in worth[:limit]]


def placement_oracle(session: Session) -> Place:
    """Where the job would go on the working snapshot as it is now: pre-filters, search, permits.

    The quota pre-filter is left out: the victim search checks quota itself, on a ledger with the
    victims released.
    """
    pre_filters = [p for p in session.profile.pre_filters if getattr(p, "name", "") != QUOTA_PLUGIN]

    def place(job: Job) -> Candidate | None:
        snap = session.snapshot
        if (
            job.kind is GpuMode.WHOLE
            and whole_workers_fit(snap, range(len(snap.models)), job.gpus_per_worker) < job.fewest_workers
        ):
            return None  # the free GPUs cannot hold the gang on any model: no search can
        state = session.new_state(job)
        for p in pre_filters:
            if not p.pre_filter(state, job).ok:
                return None
        result = search(session, state, job)
        if not result.candidates:
            return None
        k = choose(session, state, job, result.candidates)[0]
        candidate = result.candidates[k]
        for permit in session.profile.permits:
            if not permit.permit(state, job, candidate).ok:
                return None
        return candidate

    return place


def gpu_share(snapshot: Snapshot, placement: WorkerPlacement) -> float:
    """How much of its GPUs one worker holds: all of them when whole, the compute slices of its MIG
    instance out of the GPU's, or its milli share. Lost GPU-hours are counted by this share."""
    if placement.milli is not None:
        return placement.milli / FULL_GPU_MILLI
    if placement.mig is not None:
        g = snapshot.gpu_pos.get(placement.gpus[0]) if placement.gpus else None
        geo = snapshot.g_geometry[g] if g is not None else None
        prof = geo.profile(placement.mig.profile) if geo is not None else None
        if geo is not None and prof is not None:
            return prof.compute / geo.compute_slices
    return float(len(placement.gpus))


def candidate_rows(snapshot: Snapshot, eligible: Sequence[RunningJob], ctx: QueueContext) -> list[WholeJob]:
    """Running jobs as victim candidates (`VictimPool` rows, in the order given): their cost and
    where their whole GPUs are.

    The cost is the hours since the last checkpoint (or start) times the GPUs held, a MIG instance
    or a milli share counted by its share of its GPU (`gpu_share`). Ties on cost go to the lower
    priority, then to the job that has run longest. This runs for every eligible job of every
    search, hence one tuple per job and no helper calls on the whole-GPU path.
    """
    now, facts, node_pos = ctx.now, ctx.run_facts, snapshot.node_pos
    rows: list[WholeJob] = []
    for r in eligible:
        jid = r.job.id
        f = facts.get(jid)
        if f is None:
            lost_hours, started = 0.0, -math.inf
        else:
            since = f.last_checkpoint_at if f.last_checkpoint_at is not None else f.started_at
            lost_hours, started = (now - since) / 3600.0 if now > since else 0.0, f.started_at
        placements = r.allocation.placements
        if len(placements) == 1 and placements[0].mig is None and placements[0].milli is None:
            p = placements[0]
            gpus: float = len(p.gpus)
            by_node: NodeGpus = ((node_pos[p.node], len(p.gpus)),)
            freed = len(p.gpus)
        else:
            per_node: dict[int, int] = {}
            gpus = 0.0
            for p in placements:
                if p.mig is None and p.milli is None:
                    i = node_pos[p.node]
                    per_node[i] = per_node.get(i, 0) + len(p.gpus)
                    gpus += len(p.gpus)
                else:
                    gpus += gpu_share(snapshot, p)
            by_node = tuple(sorted(per_node.items()))
            freed = sum(n for _, n in by_node)
        lost = lost_hours * gpus
        rows.append(
            (lost / freed if freed > 1 else lost, lost, (r.job.priority, started), jid, by_node, freed)
        )
    return rows


def may_be_victim(running: RunningJob, ctx: QueueContext, session: Session) -> bool:
    """Preemptible, past the minimum runtime, not already being stopped, not placed in this cycle."""
    job = running.job
    jid = job.id
    if not job.preemptible or jid in ctx.in_flight or jid in session.evicted or jid in session.placed:
        return False
    facts = ctx.run_facts.get(jid)  # `ctx.runtime`, inlined: this runs for every running job
    return (ctx.now - facts.started_at if facts is not None else math.inf) >= ctx.policy.min_runtime_s


def quota_admits(
    session: Session, ctx: QueueContext, job: Job, extra: Callable[[frozenset[JobId]], bool] | None = None
) -> Callable[[frozenset[JobId], Candidate], bool]:
    """An `admissible` check: the job's queue admits it once the victims' quota is given back."""
    snap = session.snapshot
    running = dict(snap.running)  # the victims are released while this is called

    def admits(ids: frozenset[JobId], candidate: Candidate) -> bool:
        if extra is not None and not extra(ids):
            return False
        ledger = ctx.ledger.copy()
        for jid in sorted(ids):
            r = running[jid]
            ledger.release(r.job.queue, held_request(snap, r))
        req = job_request(job, snap.models[candidate.model], len(candidate.slots))
        return ledger.fits(job.queue, req)

    return admits


def commit_plan(
    session: Session, ctx: QueueContext, job: Job, found: VictimSet, kind: str, why: Mapping[JobId, str]
) -> PreemptionPlan:
    """Evict the victims, hold the preemptor's placement, charge quota; record and explain the plan."""
    snap = session.snapshot
    victims: list[Victim] = []
    for v in found.victims:
        r = snap.running[v.job_id]
        req = held_request(snap, r)
        deadline = ctx.now + ctx.grace(r.job)
        reason = why[v.job_id]
        victims.append(
            Victim(
                job_id=v.job_id,
                queue=r.job.queue,
                priority=r.job.priority,
                gpus=sum(len(p.gpus) for p in r.allocation.placements),
                lost_gpu_hours=round(v.lost_gpu_hours, 6),
                checkpoint_deadline=deadline,
                reason=reason,
            )
        )
        ctx.ledger.release(r.job.queue, req)
        ctx.fair.uncharge(r.job.queue, req)
        session.evict(
            v.job_id,
            "preempted",
            for_job=job.id,
            reasons=(Reason(ReasonCode.PRIORITY, kind, reason, {"checkpoint_deadline": str(deadline)}),),
        )
    for s in found.placement.slots:
        snap.take(job, s)
    req = job_request(job, snap.models[found.placement.model], len(found.placement.slots))
    ctx.ledger.admit(job.queue, req)
    ctx.fair.charge(job.queue, req)
    ready = max((v.checkpoint_deadline for v in victims), default=ctx.now)
    plan = PreemptionPlan(
        preemptor=job.id,
        kind=kind,
        victims=tuple(victims),
        reservation=tuple(snap.placement_of(rank, s) for rank, s in enumerate(found.placement.slots)),
        ready_at=ready,
    )
    decisions = decisions_of(session)
    decisions.add_plan(plan)
    names = ", ".join(v.job_id for v in victims)
    sentence = (
        f"waiting for {len(victims)} job(s) to checkpoint ({names}); "
        f"{sum(v.gpus for v in victims)} GPUs in {found.scope} reserved for it by t={ready:g}"
    )
    decisions.explain(job.id, sentence)
    session.pend(job, Status(StatusCode.WAIT, (Reason(ReasonCode.PRIORITY, kind, sentence),)))
    return plan


def preemptors(session: Session, ctx: QueueContext, limit: int | None = None) -> list[Job]:
    """Open jobs that waited in this cycle for capacity or quota (not a broken request), in order.

    None when the caller's cycle may not evict (``PreemptionPolicy.evict_in_cycle``): then preempt,
    reclaim and elastic plan nothing.

    At most ``limit`` of them: each costs a victim search, and like kube-scheduler a cycle only
    tries preemption for the first blocked jobs in line; the rest try again next cycle.
    """
    if not ctx.policy.evict_in_cycle:
        return []
    return blocked(session, ctx, limit)


def blocked(session: Session, ctx: QueueContext, limit: int | None = None) -> list[Job]:
    """Open jobs that waited in this cycle for capacity or quota (what :func:`preemptors` returns,
    whether or not the cycle may evict), at most ``limit``."""
    out: list[Job] = []
    decisions = decisions_of(session)
    for job in session.open_jobs():
        if limit is not None and len(out) >= limit:
            break
        pending = session.pending.get(job.id)
        if pending is None or pending.code in (StatusCode.UNRESOLVABLE, StatusCode.ERROR, StatusCode.WAIT):
            continue
        if job.id in ctx.in_flight or job.id in decisions.planned:
            continue
        out.append(job)
    return out


def search_victims(
    session: Session,
    ctx: QueueContext,
    job: Job,
    eligible: Sequence[RunningJob],
    extra: Callable[[frozenset[JobId]], bool] | None = None,
) -> VictimSet | None:
    """The cheapest victim set among ``eligible`` for ``job`` (see `find_victims`), quota checked."""
    return search_pool(
        session, ctx, job, VictimPool.whole_jobs(candidate_rows(session.snapshot, eligible, ctx)), extra
    )


def search_pool(
    session: Session,
    ctx: QueueContext,
    job: Job,
    pool: VictimPool,
    extra: Callable[[frozenset[JobId]], bool] | None = None,
) -> VictimSet | None:
    """`search_victims` on candidates already in a pool."""
    return find_victims_in(
        session.snapshot,
        job,
        pool,
        placement_oracle(session),
        admissible=quota_admits(session, ctx, job, extra),
    )


def max_attempts(args: Mapping[str, object] | None, default: int = 8) -> int:
    """The ``max_preemptors`` action arg: victim searches per cycle."""
    value = (args or {}).get("max_preemptors", default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("max_preemptors must be a positive integer")
    return value


class Preempt:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        self.max_preemptors = max_attempts(args)

    def execute(self, session: Session) -> None:
        ctx = context_of(session)
        blocked = preemptors(session, ctx, self.max_preemptors)
        if not blocked:
            return
        # One pass over the running jobs, in snapshot order (`VictimPool` orders them by cost), and
        # their costs once per queue: every blocked job of the queue picks from the same rows.
        allowed: dict[str, list[RunningJob]] = {j.queue: [] for j in blocked}
        for r in session.snapshot.running.values():
            same_queue = allowed.get(r.job.queue)
            if same_queue is not None and may_be_victim(r, ctx, session):
                same_queue.append(r)
        rows_of: dict[str, list[WholeJob]] = {}
        for job in blocked:
            if job.queue not in rows_of:
                rows_of[job.queue] = candidate_rows(session.snapshot, allowed[job.queue], ctx)
            # Evictions (and placements) change during this loop: check those again.
            rows = [
                row
                for r, row in zip(allowed[job.queue], rows_of[job.queue], strict=True)
                if r.job.priority < job.priority
                and r.job.id not in session.evicted
                and r.job.id not in session.placed
            ]
            if not rows:
                continue
            found = search_pool(session, ctx, job, VictimPool.whole_jobs(rows))
            if found is None:
                continue
            why = {
                v.job_id: (
                    f"priority {session.snapshot.running[v.job_id].job.priority} < {job.priority} "
                    f"of {job.id} in queue {job.queue}"
                )
                for v in found.victims
            }
            commit_plan(session, ctx, job, found, NAME, why)
