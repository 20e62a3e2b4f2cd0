"""The cycle-wide queue facts (queues, quotas, fair share, time) and what its actions decide.

The queue-aware plugins and actions (quota, fair order, preempt, reclaim, reserve, backfill, elastic) share
one `QueueContext`, put in `Session.shared` under `QUEUES` by `run_queue_cycle`. It carries the
injected time (`now`, seconds on the caller's clock), the facts the job model does not hold
(submit times, when each running job started and last checkpointed, when it is expected to end),
the quota ledger (a working copy: admissions in this cycle are charged to it) and fair shares.

What queue-aware actions decide beyond the framework's `Plan` is collected in a `QueueDecisions` under
`DECISIONS`: preemption plans (victims to checkpoint, their grace deadlines, the reservation the
preemptor holds meanwhile), reservations for blocked gangs, elastic resizes and per-job
explanations (quota position, fair-share position, priority, "waiting for reservation at T").
`run_queue_cycle` returns both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gangline.core.actions.allocate import allocate_one
from gangline.core.fairshare import FairShare, Pending, UsageHistory
from gangline.core.framework.cycle import AllocationIds, Session, default_allocation_id
from gangline.core.framework.plan import Plan
from gangline.core.framework.profile import Profile
from gangline.core.framework.state import StateKey
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import GpuId, GpuMode, GpuModel, Job, JobId, QueueName, WorkerPlacement
from gangline.core.placement import whole_workers_fit
from gangline.core.queues import (
    QueueSpec,
    QuotaLedger,
    QuotaTree,
    Resource,
    gpu_resource,
    job_request,
)
from gangline.core.quota_gate import Flavour, fair_admission
from gangline.core.snapshot import RunningJob, Slot, Snapshot
from gangline.core.waiting import cycle_jobs, line_time, waiting_line


@dataclass(frozen=True, slots=True)
class RunFacts:
    """When a running job started, last checkpointed, and is expected to end (None: unknown)."""

    started_at: float
    last_checkpoint_at: float | None = None
    expected_end: float | None = None

    def lost_hours(self, now: float) -> float:
        """Hours of work since the last checkpoint (or start) that stopping it now throws away."""
        since = self.last_checkpoint_at if self.last_checkpoint_at is not None else self.started_at
        return max(0.0, now - since) / 3600.0


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    """Knobs of preemption and reclaim."""

    min_runtime_s: float = 0.0
    """A job that has run less than this is never a victim (it has not had time to checkpoint)."""
    default_grace_s: float = 30.0
    """Checkpoint grace for jobs that give none."""
    reclaim_lower_priority_only: bool = False
    """Kueue's reclaimWithinCohort=LowerPriority: reclaim only from lower-priority borrowers."""
    evict_in_cycle: bool = True
    """Whether the cycle's evictions take effect at once (the simulator). False where victims are
    asked to checkpoint by another service (live placement: the preemption service chooses and asks
    them with the core's victim search): then no action plans an eviction or a shrink."""
    grow_in_cycle: bool = True
    """Whether the elastic action grows running elastic jobs into idle GPUs in this cycle (placement's
    cycle and the simulator: they own the idle GPUs). False where the cycle only plans for waiting
    work (the preemption service's planner)."""


@dataclass(frozen=True, slots=True)
class Victim:
    """A running job to checkpoint and stop (or shrink), and what it costs."""

    job_id: JobId
    queue: str
    priority: int
    gpus: int
    lost_gpu_hours: float
    checkpoint_deadline: float
    reason: str
    keep_workers: int | None = None
    """For an elastic shrink: the workers it keeps (None: it stops entirely)."""


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Which jobs to checkpoint, by when, and the GPUs the preemptor holds meanwhile."""

    preemptor: JobId
    kind: str
    """``preempt`` (priority in the queue), ``reclaim`` (quota lent in the cohort), ``reserve``
    (a reservation due now, held by preemptible backfill) or ``shrink`` (elastic)."""
    victims: tuple[Victim, ...]
    reservation: tuple[WorkerPlacement, ...]
    ready_at: float
    """When every victim's grace has run out: the preemptor starts then at the latest."""

    @property
    def lost_gpu_hours(self) -> float:
        return sum(v.lost_gpu_hours for v in self.victims)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Specific GPUs held for a blocked gang from ``start`` (its earliest start time)."""

    job_id: JobId
    start: float
    placements: tuple[WorkerPlacement, ...]
    gpu_indexes: frozenset[int]
    """Snapshot GPU indexes (for fast overlap tests inside the cycle)."""


@dataclass(frozen=True, slots=True)
class Resize:
    """An elastic job to restart from its checkpoint with ``to_workers`` workers on ``placements``."""

    job_id: JobId
    from_workers: int
    to_workers: int
    placements: tuple[WorkerPlacement, ...]
    checkpoint_deadline: float


@dataclass
class QueueDecisions:
    """Queue-aware outcomes of one cycle, in decision order."""

    preemptions: list[PreemptionPlan] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)
    explanations: dict[JobId, list[str]] = field(default_factory=dict)
    planned: set[JobId] = field(default_factory=set)
    """Preemptors with a plan in this cycle: they wait for their victims, nothing else places them."""

    def add_plan(self, plan: PreemptionPlan) -> None:
        self.preemptions.append(plan)
        self.planned.add(plan.preemptor)

    def explain(self, job_id: JobId, sentence: str) -> None:
        lines = self.explanations.setdefault(job_id, [])
        if sentence not in lines:
            lines.append(sentence)


@dataclass
class QueueContext:
    """Cycle-wide queue facts; see the module docstring. ``ledger`` and ``fair`` are working copies."""

    now: float
    ledger: QuotaLedger
    fair: FairShare
    submit_time: Mapping[JobId, float]
    run_facts: Mapping[JobId, RunFacts] = field(default_factory=dict)
    policy: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    in_flight: frozenset[JobId] = frozenset()
    """Jobs already being checkpointed for an earlier plan: never chosen again, never re-planned."""
    freeing: Mapping[JobId, frozenset[GpuId]] = field(default_factory=dict)
    """Per preemptor of an earlier plan still in flight, the GPUs its victims hold or held: those
    already free are kept for it until it is placed, and nothing else is held back for it."""
    explain: bool = True
    """Whether the cycle writes the queue's side of why jobs wait (`explain_waiting`, backfill's
    sentences about reserved GPUs). They decide nothing: a caller that never reads them (the
    simulator) may leave them out."""
    start_memo: dict[tuple[object, ...], EarliestStart] | None = None
    """Reserve's earliest-start searches, kept by the caller across cycles (None: not kept). An entry
    is read only on the snapshot version it was found on (`Snapshot.version`: any committed change
    makes it stale) and while the working snapshot is still the cycle's own (see
    `backfill.earliest_start`); the caller must empty it when its running jobs' facts change with no
    change to the snapshot."""

    def lost_hours(self, job_id: JobId) -> float:
        facts = self.run_facts.get(job_id)
        return facts.lost_hours(self.now) if facts is not None else 0.0

    def runtime(self, job_id: JobId) -> float:
        facts = self.run_facts.get(job_id)
        return self.now - facts.started_at if facts is not None else math.inf

    def expected_end(self, job: Job) -> float | None:
        facts = self.run_facts.get(job.id)
        if facts is not None and facts.expected_end is not None:
            return facts.expected_end
        if facts is not None and job.run_bound_s is not None:
            return facts.started_at + job.run_bound_s
        return None

    def grace(self, job: Job) -> float:
        return float(job.checkpoint_grace_s) if job.checkpoint_grace_s else self.policy.default_grace_s


@dataclass(frozen=True, slots=True)
class EarliestStart:
    """A remembered earliest start: where and when, and the earliest expected end it was read with
    (the result holds while the clock has not passed it)."""

    start: float
    candidate: Any
    valid_until: float
    version: int
    """The snapshot version it was found on (`Snapshot.version`); on any other it is not read."""


QUEUES: StateKey[QueueContext] = StateKey("queueing.queues")
DECISIONS: StateKey[QueueDecisions] = StateKey("queueing.decisions")


def context_of(session: Session) -> QueueContext:
    """The cycle's queue facts; a cycle run without them (plain ``run_cycle``) gets neutral ones.

    Neutral facts: every queue of the cycle unlimited, time 0, no submit times and no known ends
    (see :func:`open_context`), so a profile with queue-aware actions runs anywhere a profile runs.
    """
    ctx: QueueContext | None = session.shared.get(QUEUES)
    if ctx is None:
        ctx = session.shared[QUEUES] = open_context(session.snapshot, session.jobs, now=0.0)
    return ctx


def open_tree(snapshot: Snapshot, jobs: Sequence[Job]) -> QuotaTree:
    """Every queue of ``jobs`` and of the snapshot's running jobs, unlimited: no quota applies."""
    names = {j.queue for j in jobs}
    names.update(snapshot.queue_running)
    return _unlimited_tree(tuple(sorted(names)))


@lru_cache(maxsize=64)
def _unlimited_tree(names: tuple[QueueName, ...]) -> QuotaTree:
    """The tree of these queues, all unlimited (trees are immutable: one per set of names serves all)."""
    return QuotaTree([QueueSpec(q, unlimited=True) for q in names])


def open_context(
    snapshot: Snapshot,
    jobs: Sequence[Job],
    *,
    now: float,
    submit_time: Mapping[JobId, float] | None = None,
    run_facts: Mapping[JobId, RunFacts] | None = None,
    in_flight: frozenset[JobId] = frozenset(),
    freeing: Mapping[JobId, frozenset[GpuId]] | None = None,
    policy: PreemptionPolicy | None = None,
) -> QueueContext:
    """The queue facts of a cycle where no quota applies (:func:`open_tree`), for callers that gate
    quota elsewhere (the placement service: the quota service decided) or have none (a bare cluster)."""
    return build_context(
        snapshot,
        open_tree(snapshot, jobs),
        now=now,
        submit_time=submit_time or {},
        run_facts=run_facts,
        in_flight=in_flight,
        freeing=freeing,
        policy=policy,
    )


def decisions_of(session: Session) -> QueueDecisions:
    out: QueueDecisions | None = session.shared.get(DECISIONS)
    if out is None:
        out = QueueDecisions()
        session.shared[DECISIONS] = out
    return out


def held_request(snapshot: Snapshot, running: RunningJob) -> dict[Resource, int]:
    """The quota a running job holds: its model (from its first GPU) and its placed worker count."""
    return snapshot.held_by(running)


def held_by_queue(snapshot: Snapshot, tree: QuotaTree) -> dict[QueueName, dict[Resource, int]]:
    """The quota the snapshot's running jobs hold, per queue of ``tree`` with running jobs (queues it
    does not know are left out): what :func:`held_request` gives summed over each queue's jobs, read
    from the snapshot's own count (`Snapshot.queue_held`, kept as jobs start and end), not a pass over
    every running job (this runs every cycle)."""
    return {q: dict(held) for q, held in snapshot.queue_held.items() if tree.has_queue(q)}


def build_context(
    snapshot: Snapshot,
    tree: QuotaTree,
    *,
    now: float,
    submit_time: Mapping[JobId, float],
    run_facts: Mapping[JobId, RunFacts] | None = None,
    history: UsageHistory | None = None,
    policy: PreemptionPolicy | None = None,
    in_flight: frozenset[JobId] = frozenset(),
    freeing: Mapping[JobId, frozenset[GpuId]] | None = None,
) -> QueueContext:
    """A context whose ledger and fair shares hold what the snapshot's running jobs use.

    Running jobs of queues the tree does not know are left out of quota (they cannot be charged).
    Fair-share capacity is the cluster's whole GPUs per model (MIG/shared resources use their own
    totals only if the caller's tree names them; they never dominate otherwise).
    """
    ledger = QuotaLedger(tree)
    allocation = held_by_queue(snapshot, tree)
    for q in sorted(allocation):
        ledger.admit(q, allocation[q])
    capacity = {gpu_resource(m): c for m, c in zip(snapshot.models, snapshot.capacity, strict=True)}
    for res in tree.resources:
        capacity.setdefault(res, tree.total_nominal(res))
    fair = FairShare(
        capacity=capacity,
        weights={q: tree.weight(q) for q in tree.queue_names()},
        allocation=allocation,
        history=history,
    )
    return QueueContext(
        now=now,
        ledger=ledger,
        fair=fair,
        submit_time=submit_time,
        run_facts=run_facts or {},
        policy=policy or PreemptionPolicy(),
        in_flight=in_flight,
        freeing=freeing or {},
    )


def request_for_order(job: Job, snapshot: Snapshot) -> dict[Resource, int]:
    """The request used to order jobs: on its GPU type, or the cluster's first type when it has none."""
    model = job.gpu_type if job.gpu_type is not None else (snapshot.models[0] if snapshot.models else None)
    return job_request(job, GpuModel(model)) if model is not None else {}


def fair_order(
    jobs: Sequence[Job],
    ctx: QueueContext,
    snapshot: Snapshot,
    *,
    starvation_s: float | None = None,
    short_first_weight: float | None = None,
) -> list[Job]:
    """Priority, then the queue's dominant share (growing as work is admitted), then submit time (moved
    back by :func:`~gangline.core.waiting.line_time` with ``short_first_weight``); with
    ``starvation_s``, jobs submitted longer ago than that go first at their priority, oldest first.

    The quota gate's fair admission (:func:`gangline.core.quota_gate.fair_admission`, the rule the quota
    service lets jobs through by), on copies of the ledger and the fair shares: each job is charged as
    if admitted when its queue's quota would admit it (work that cannot run must not push its queue
    back), on its GPU type or the cluster's first (:func:`request_for_order`).
    """
    aged_before = ctx.now - starvation_s if starvation_s is not None else None

    def line(job: Job) -> float:
        # a starving job keeps its submit time: the bound serves it oldest first, as without the rule
        submitted = ctx.submit_time.get(job.id, 0.0)
        if aged_before is not None and submitted <= aged_before:
            return submitted
        return line_time(job, submitted, short_first_weight)

    items = [Pending(j.queue, j.priority, line(j), j.id, j) for j in jobs]
    # One flavour per request shape (read only by the gate).
    flavours: dict[tuple[object, ...], tuple[Flavour, ...]] = {}

    def flavours_of(job: Job) -> tuple[Flavour, ...]:
        shape = (job.gpu_type, job.mig_profile, job.gpu_milli, job.workers, job.gpus_per_worker)
        known = flavours.get(shape)
        if known is None:
            known = flavours[shape] = (Flavour(job.gpu_type, request_for_order(job, snapshot)),)
        return known

    admission = fair_admission(
        items, ctx.ledger.copy(), ctx.fair.clone(), flavours_of, aged_before=aged_before
    )
    return [job for job, _ in admission]


def run_queue_cycle(
    snapshot: Snapshot,
    jobs: Sequence[Job],
    profile: Profile,
    ctx: QueueContext,
    *,
    cycle: int,
    allocation_id: AllocationIds = default_allocation_id,
) -> tuple[Plan, QueueDecisions]:
    """One cycle with queue facts: jobs in fair order, ``ctx`` shared with every plugin and action.

    Like `run_cycle`, the snapshot is left as it was; ``ctx.ledger`` and ``ctx.fair`` are the
    caller's working copies and hold this cycle's admissions afterwards.
    """
    settings = profile.settings
    ordered = fair_order(
        jobs,
        ctx,
        snapshot,
        starvation_s=settings.starvation_s,
        short_first_weight=settings.short_first_weight,
    )
    with snapshot.transaction():
        session = Session(snapshot, profile, ordered, cycle=cycle, allocation_id=allocation_id)
        shared: dict[StateKey[Any], Any] = session.shared
        shared[QUEUES] = ctx
        session.explain = ctx.explain
        decisions = decisions_of(session)
        hold_for_preemptors(session, ctx, decisions)
        for action in profile.actions:
            action.execute(session)
        plan = session.plan()
    if ctx.explain:
        explain_waiting(plan, ordered, ctx, decisions)
    return plan, decisions


def placement_cycle(
    snapshot: Snapshot,
    waiting: Sequence[Job],
    admitted_at: Mapping[JobId, float],
    profile: Profile,
    context: Callable[[list[Job]], QueueContext],
    *,
    head: int,
    cycle: int,
    allocation_id: AllocationIds = default_allocation_id,
) -> tuple[Plan, QueueDecisions]:
    """Placement's cycle over the jobs the quota gate let through (they hold their quota already, see
    :mod:`gangline.core.charging`): the placement service's and the core simulator's, the same rule.

    The jobs in line (:func:`~gangline.core.waiting.waiting_line`: priority, then admitted time, moved
    back by the profile's ``short_first_weight``), of
    which the cycle sees the first ``head`` and every later one the free GPUs could hold
    (:func:`~gangline.core.waiting.cycle_jobs`); ``context`` gives the queue facts for those (no
    quota: the gate decided; :func:`open_context`). The snapshot is left as it was.
    """
    line = waiting_line(waiting, admitted_at, short_first_weight=profile.settings.short_first_weight)
    jobs = cycle_jobs(snapshot, line, head)
    return run_queue_cycle(snapshot, jobs, profile, context(jobs), cycle=cycle, allocation_id=allocation_id)


TAKING_ACTIONS = frozenset({"allocate", "reserve", "backfill"})
"""Actions that only take free GPUs for waiting jobs (reserve evicts only preemptible running jobs)."""


def places_nothing(snapshot: Snapshot, waiting: Sequence[Job], profile: Profile) -> bool:
    """Whether a cycle of ``profile`` over ``waiting`` on ``snapshot`` is sure to place and evict nothing:
    its actions only take free GPUs (:data:`TAKING_ACTIONS`), no preemptible job runs (so reserve has
    no victim), and no waiting job is a whole-GPU gang whose fewest workers the free GPUs could hold
    (:func:`~gangline.core.placement.whole_workers_fit`, the bound allocate itself skips on). Such a
    cycle only explains why the jobs wait; a caller that reads nothing else may leave it out."""
    if snapshot.preemptible_running or any(a.name not in TAKING_ACTIONS for a in profile.actions):
        return False
    models = range(len(snapshot.models))
    fit: dict[int, int] = {}  # workers of so many GPUs the free GPUs hold: one count per size
    for job in waiting:
        if job.kind is not GpuMode.WHOLE:
            return False
        per = job.gpus_per_worker
        n = fit.get(per)
        if n is None:
            n = fit[per] = whole_workers_fit(snapshot, models, per)
        if n >= job.fewest_workers:
            return False
    return True


def hold_for_preemptors(session: Session, ctx: QueueContext, decisions: QueueDecisions) -> None:
    """Keep the GPUs freed for each in-flight preemptor (``ctx.freeing``) for it, and only those.

    Before the profile's actions, each such preemptor of the cycle, in order, is placed if it fits
    now; otherwise the free GPUs among those its victims are giving back are taken for it in the
    working snapshot (so no other job of the cycle gets them) and it waits, set aside, for the rest.
    Work that would not take those GPUs is not held back at all: another GPU model, other nodes.
    """
    if not ctx.freeing:
        return
    snap = session.snapshot
    for job in session.open_jobs():
        gpus = ctx.freeing.get(job.id)
        if gpus is None:
            continue
        if allocate_one(session, job).ok:
            continue
        held = 0
        for gpu in sorted(gpus):
            g = snap.gpu_pos.get(gpu)
            if g is None:
                continue
            slot = Slot(snap.g_node[g], (g,))
            if snap.slot_conflict(job, slot) is None:
                snap.take(job, slot)
                held += 1
        session.set_aside.add(job.id)
        reason = Reason(
            ReasonCode.RESERVATION,
            "preemption",
            f"waiting for {len(gpus)} GPU(s) its preemption is freeing; {held} free and held for it",
            {"freeing": len(gpus), "held": held},
        )
        prior = session.pending.get(job.id)
        session.pend(job, Status(StatusCode.UNSCHEDULABLE, (reason, *(prior.reasons if prior else ()))))
        decisions.explain(job.id, reason.message)


def explain_waiting(plan: Plan, ordered: Sequence[Job], ctx: QueueContext, decisions: QueueDecisions) -> None:
    """Add the queue's side of "why is my job pending?" to every job left waiting.

    Its place in line ("3rd of 40 waiting; 2 ahead have higher priority"), its queue's quota
    position ("team-a uses 48 of its 48 H100; cohort has 0 to lend") and fair-share position.
    """
    waiting = {p.job_id for p in plan.pending}
    if not waiting:
        return
    by_queue: dict[QueueName, str] = {}
    line = [j for j in ordered if j.id in waiting]
    higher = 0
    for k, job in enumerate(line):
        if k and line[k - 1].priority > job.priority:
            higher = k
        place_in_line = f"{k + 1} of {len(line)} waiting in line; {higher} ahead have higher priority"
        decisions.explain(job.id, f"priority {job.priority}: {place_in_line}")
        if job.queue not in by_queue:
            by_queue[job.queue] = _queue_sentence(job.queue, ctx)
        decisions.explain(job.id, by_queue[job.queue])


def _queue_sentence(queue: QueueName, ctx: QueueContext) -> str:
    tree = ctx.ledger.tree
    if not tree.has_queue(queue):
        return f"queue {queue} is not configured"
    parts = []
    for r in sorted(tree.resources):
        nominal = tree.nominal(queue, r)
        used = ctx.ledger.usage(queue, r)
        if nominal or used:
            lend = ctx.ledger.cohort_lendable(queue, r)
            parts.append(f"{queue} uses {used} of its {nominal} {r}; cohort has {lend} to lend")
    parts.append(ctx.fair.describe(queue))
    return "; ".join(parts)
