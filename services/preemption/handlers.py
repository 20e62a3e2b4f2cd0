"""Preemption's decisions (pure): the core plans who is preempted, this service asks, releases, requeues.

The service mirrors the cluster exactly as placement does (the same fold). Once per batch
(:func:`end_batch`) it runs the core's ``preempt`` and ``reclaim`` actions (the simulator's code
path: :func:`~gangline.core.actions.queueing.run_queue_cycle`, evictions planned in the cycle, on the
mirror's snapshot, which the cycle leaves as it was) for the jobs waiting for it:

* jobs placement said are pending for a reason other than quota (capacity, topology, ...), since the
  last batch;
* jobs the quota service holds (its ``job.pending``, code quota), until it queues them: the core
  reclaims quota their queue lent to the cohort when it is owed (quota says so: constraint
  ``reclaim``), or takes it from lower-priority work of their own queue. They are handed to the core
  as they are (on the GPU model quota names), and the core's quota ledger, built from the running
  jobs, checks that the victims' release lets them fit. Quota decides who is owed quota; the victims
  are chosen here. Only those owed, or outranking preemptible work of their queue, go to the core,
  owed ones first, at most ``MAX_HELD_PLANNED`` a batch, and only after a batch that folded something
  that may change their plan (a grant, a release, a new hold, a node); a victim too young for the
  minimum runtime is looked at again then.

The cycle's quota tree is the queues file's (unlimited queues included); its run facts (start from
the grant, last checkpoint from ``job.checkpointed``) make the cost the GPU-hours lost since each
victim's last checkpoint, MIG slices and shares counted by their share; a job that has run less than
``min_runtime_s`` is never a victim. The core's victim sets are minimal, free a placement that fits
the whole gang (topology included), and a reclaim never takes a victim's queue below its nominal.
As in the simulator, priority takes only lower-priority work of the job's own queue; across queues
only what a queue borrows is taken back. Each plan's victims (``decisions.preemptions``) are asked as before.

Each victim gets ``job.preempting`` with a deadline (now + its ``checkpoint_grace_s``). On the
agent's ``job.checkpointed``, or when the deadline passes (checked at the end of every batch;
heartbeats are the clock), the victim's allocation is released (``preempted``), ``job.preempted``
says whether it checkpointed, and ``job.requeued`` sends it back to its queue to resume from the
checkpoint. A victim whose end (``job.completed`` / ``job.failed`` of that allocation) is read first,
or in the same batch as its checkpoint, is left alone: placement releases it for that end, and a
second release would requeue a finished job.
Placement, seeing the release, places the urgent job first (it orders by priority, and
keeps the GPUs its victims free for it).

The service folds every event of a poll (:func:`fold_event`) and plans once per batch
(:func:`end_batch`), one core cycle for all the jobs above. :func:`decide` does both for a single
event.

State is bounded by the live jobs: what is kept per allocation (start time, asked to checkpoint) is
dropped when the allocation is released, a job's last checkpoint and hold when the mirror retires
the job. A re-delivered event about a released allocation or a retired job adds nothing back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

from gangline.bus import Outgoing
from gangline.core.actions.elastic import NAME as ELASTIC
from gangline.core.actions.preempt import MAX_HELD_PLANNED, HeldJob, gpu_share, held_to_plan
from gangline.core.actions.queueing import (
    PreemptionPlan,
    PreemptionPolicy,
    Resize,
    RunFacts,
    build_context,
    run_queue_cycle,
)
from gangline.core.actions.reclaim import NAME as RECLAIM
from gangline.core.defaults import default_profile, planning_profile
from gangline.core.framework.profile import Profile
from gangline.core.model import Allocation, GpuModel, Job
from gangline.core.model import AllocationId as CoreAllocationId
from gangline.core.model import JobId as CoreJobId
from gangline.core.queues import QuotaTree
from gangline.core.resize import grow_falls_back
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPending,
    JobPreempted,
    JobPreempting,
    JobQueued,
    JobRequeued,
    JobResizing,
)
from gangline.events.nodes import GpuHealthChanged, NodeCordoned, NodeFailed, NodeRegistered, NodeUncordoned
from gangline.events.types import AllocationId, JobId, Seconds
from gangline.fold.adapter import core_allocation, core_job, core_placements, wire_placements
from gangline.fold.cluster import ClusterFold, JobRecord
from gangline.queues_file import load_queues
from services.common.topics import TopicNames

SOURCE = "gangline/preemption"


@dataclass
class InFlight:
    job_id: JobId
    allocation_id: AllocationId
    deadline: datetime
    preemptor: JobId


@dataclass(frozen=True)
class Held:
    """What quota's latest pending for a job it holds says."""

    gpu_type: str | None
    """The GPU model it would charge the job to (None: any)."""
    owed: bool
    """The job is owed its nominal quota (constraint reclaim): borrowers of the cohort may give it back."""
    job: Job | None = None
    """The core's job of its own spec (None: its spec was not read)."""


@dataclass
class Mirror(ClusterFold):
    """The cluster as placement sees it (the one lifecycle fold), with what a victim search reads."""

    topics: TopicNames = field(default_factory=TopicNames)
    profile: Profile = field(default_factory=default_profile)
    cycle: int = 0


@dataclass
class PreemptionState:
    mirror: Mirror
    tree: QuotaTree = field(default_factory=lambda: load_queues(None).whole_tree)
    """The queues file's quota tree, unlimited queues included (``Queues.whole_tree``); without a
    file, one unlimited ``default`` queue."""
    policy: PreemptionPolicy = field(
        default_factory=lambda: PreemptionPolicy(default_grace_s=0.0, grow_in_cycle=False)
    )
    """The planner shrinks elastic jobs for waiting work but never grows one: placement does."""
    planner: Profile | None = None
    """:func:`~gangline.core.defaults.planning_profile` of the mirror's profile (built on first use)."""
    started_at: dict[AllocationId, datetime] = field(default_factory=dict)
    """Live allocations: when they were granted."""
    checkpoints: dict[JobId, tuple[datetime, str]] = field(default_factory=dict)
    """Jobs the mirror holds: their last checkpoint (when, where)."""
    in_flight: dict[AllocationId, InFlight] = field(default_factory=dict)
    asked: set[AllocationId] = field(default_factory=set)
    """Allocations asked to checkpoint and not released yet (so a restart never asks twice)."""
    asked_before_granted: dict[AllocationId, InFlight] = field(default_factory=dict)
    """Requests read before their grant (a restore reads jobs.events before allocations.log)."""
    pending: dict[JobId, None] = field(default_factory=dict)
    """Jobs placement said are pending (not for quota) since the last plan, in order."""
    held: dict[JobId, Held] = field(default_factory=dict)
    """Jobs the quota service holds (its latest ``job.pending`` for them, code quota, since their last
    ``job.queued``)."""
    replan: bool = False
    """Something folded since the last plan may change the plans of the jobs quota holds."""
    checkpointed: set[AllocationId] = field(default_factory=set)
    """Victims whose ``job.checkpointed`` was read in this batch: :func:`end_batch` finishes them."""

    SNAPSHOT_FIELDS: ClassVar[tuple[str, ...]] = (
        *(f"mirror.{name}" for name in ClusterFold.SNAPSHOT_FIELDS),
        "started_at",
        "checkpoints",
        "in_flight",
        "asked",
        "asked_before_granted",
        "held",
    )
    """What folding the log fills (services.common.snapshots): not ``pending`` (placement's pending
    reasons seen live since the last plan) nor ``checkpointed`` (this batch's, finished at its end), the
    settings, nor the planner built from them."""
    SNAPSHOT_VERSION: ClassVar[int] = 3
    """2: the lifecycle fold keeps elastic resizes; 3: its retired jobs packed (gangline.fold.retired)."""

    def snapshot_loaded(self) -> None:
        """After a snapshot is loaded: plan for the held jobs, as after a restore from the log (which
        folded their holds: ``replan`` matters only when some job is held)."""
        self.replan = True

    def restore(self, envelope: Envelope) -> None:
        self.fold(envelope)

    def fold(self, envelope: Envelope) -> None:
        self.mirror.fold(envelope)
        data = envelope.data
        if isinstance(data, AllocationGranted):
            self.replan = True
            if self._live(data.job_id, data.allocation_id):
                self.started_at.setdefault(data.allocation_id, envelope.time)
                waiting = self.asked_before_granted.pop(data.allocation_id, None)
                if waiting is not None:
                    self.in_flight.setdefault(data.allocation_id, waiting)
        elif isinstance(data, AllocationReleased):
            self.replan = True
            self.in_flight.pop(data.allocation_id, None)
            self.asked_before_granted.pop(data.allocation_id, None)
            self.started_at.pop(data.allocation_id, None)
            self.asked.discard(data.allocation_id)
            self._forget_if_retired(data.job_id)
        elif isinstance(data, JobCompleted | JobFailed):
            if data.allocation_id is not None:
                # It ended by itself before it was preempted: placement releases it (completed/failed), and
                # releasing it here as preempted too would requeue a finished job.
                self.in_flight.pop(data.allocation_id, None)
                self.asked_before_granted.pop(data.allocation_id, None)
            self._forget_if_retired(data.job_id)
        elif isinstance(data, JobQueued):
            self.held.pop(data.job_id, None)  # quota let it through: placement takes it from here
        elif isinstance(data, JobPending):
            reason = next((r for r in data.reasons if r.code == "quota"), None)
            record = self.mirror.jobs.get(data.job_id)
            if reason is not None and record is not None:
                model = reason.details.get("gpu_type")
                self.held[data.job_id] = Held(
                    model if isinstance(model, str) and model != "any" else None,
                    owed=reason.constraint == RECLAIM,
                    job=core_job(data.job_id, record.spec) if record.spec is not None else None,
                )
                self.replan = True
        elif isinstance(data, NodeRegistered | NodeFailed | GpuHealthChanged | NodeCordoned | NodeUncordoned):
            self.replan = True
        elif isinstance(data, JobCheckpointed):
            if data.job_id in self.mirror.jobs:
                self.checkpoints[data.job_id] = (envelope.time, data.checkpoint)
        elif isinstance(data, JobPreempting):
            if self._released(data.job_id, data.allocation_id):
                return  # re-delivered after the release: nothing left to ask
            self.asked.add(data.allocation_id)
            flight = InFlight(
                data.job_id, data.allocation_id, data.deadline, data.preemptor_job_id or JobId("unknown")
            )
            if self._live(data.job_id, data.allocation_id):
                self.in_flight.setdefault(data.allocation_id, flight)
            else:
                self.asked_before_granted.setdefault(data.allocation_id, flight)

    def awaits_deadline(self) -> bool:
        """Whether a victim or a resizing job is asked to checkpoint (heartbeats are then its clock)."""
        return bool(self.in_flight or self.mirror.resizing)

    def _record(self, job_id: JobId) -> JobRecord | None:
        return self.mirror.jobs.get(job_id)

    def _live(self, job_id: JobId, allocation_id: AllocationId) -> bool:
        record = self._record(job_id)
        live = record.live() if record is not None else None
        return live is not None and live.allocation_id == allocation_id

    def _released(self, job_id: JobId, allocation_id: AllocationId) -> bool:
        record = self._record(job_id)
        if record is None:
            return allocation_id in self.mirror.retired.get(job_id, ())
        return allocation_id in record.released

    def _forget_if_retired(self, job_id: JobId) -> None:
        if job_id not in self.mirror.jobs:
            self.checkpoints.pop(job_id, None)
            self.pending.pop(job_id, None)
            self.held.pop(job_id, None)

    def run_facts(self, job_id: JobId, granted: AllocationGranted) -> RunFacts | None:
        """When the allocation started and the job last checkpointed since (None: grant not read)."""
        started = self.started_at.get(granted.allocation_id)
        if started is None:
            return None
        checkpoint = self.checkpoints.get(job_id)
        last = checkpoint[0] if checkpoint is not None and checkpoint[0] > started else None
        return RunFacts(started_at=started.timestamp(), last_checkpoint_at=last.timestamp() if last else None)


def decide(envelope: Envelope, state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Fold one event and, when it leaves a job pending, plan at once."""
    return fold_event(envelope, state, now=now) + end_batch(state, now=now)


def fold_event(envelope: Envelope, state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Fold one event: note checkpointed victims and pending jobs (the batch's end acts on them)."""
    data = envelope.data
    state.fold(envelope)
    if isinstance(data, JobCheckpointed) and (
        data.allocation_id in state.in_flight or data.allocation_id in state.mirror.resizing
    ):
        state.checkpointed.add(data.allocation_id)
    elif isinstance(data, JobPending) and not any(r.code == "quota" for r in data.reasons):
        state.pending[data.job_id] = None
    return []


def finish_victims(state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Release the victims that checkpointed in this batch, and those whose deadline passed without one.

    Once per batch, after every event of it was folded: a victim whose own end (``job.completed`` /
    ``job.failed``) is read in the same batch as its checkpoint is left to placement, which releases it
    for that end (an agent reports a job that finishes in its grace right after its checkpoint).
    """
    out: list[Outgoing] = []
    for flight in sorted(state.in_flight.values(), key=lambda f: f.allocation_id):
        checkpointed = flight.allocation_id in state.checkpointed
        if checkpointed or now >= flight.deadline:
            out += finish(state, flight, checkpointed=checkpointed, now=now)
    for _, resize in sorted(state.mirror.resizing.items()):
        if resize.allocation_id in state.checkpointed or now >= resize.deadline:
            out += finish_resize(state, resize, now=now)
    state.checkpointed.clear()
    return out


def end_batch(state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Finish the victims due, then plan for the jobs found pending since the last plan, and for those
    quota holds when due."""
    out = finish_victims(state, now=now)
    jobs = _to_plan(state)
    state.pending.clear()
    state.replan = False
    planned = plan_preemptions(state, jobs, now=now) if jobs else []
    if planned:
        planned += finish_victims(state, now=now)  # a victim with no grace period is released at once
    return out + planned


def _to_plan(state: PreemptionState) -> list[Job]:
    """The core's jobs to plan for (not those an earlier plan frees room for: victims asked to checkpoint,
    elastic jobs asked to shrink): placement's pending (capacity), then, when something changed since
    the last plan, the jobs quota holds that the core's :func:`~gangline.core.actions.preempt.held_to_plan`
    picks (owed their nominal quota, or outranking preemptible work of their queue)."""
    mirror = state.mirror
    preempting = {f.preemptor for f in state.in_flight.values()}
    preempting |= {r.preemptor_job_id for r in mirror.resizing.values() if r.preemptor_job_id is not None}
    jobs: list[Job] = []
    seen: set[JobId] = set()
    for job_id in state.pending:
        record = mirror.jobs.get(job_id)
        if job_id in preempting or record is None or job_id not in mirror.waiting:
            continue  # already freeing room for it, or placed or gone since
        core = record.core()
        if core is not None:
            jobs.append(core)
            seen.add(job_id)
    if state.replan and state.held and not mirror.snapshot().preemptible_running:
        return jobs  # no preemptible job runs: neither preempt nor reclaim has a victim for them

    if state.replan and state.held:
        held: list[HeldJob] = []
        for job_id, hold in state.held.items():
            record = mirror.jobs.get(job_id)
            if job_id in preempting or job_id in seen or record is None or record.spec is None:
                continue
            if record.finished or record.live() is not None or record.admitted_at is None:
                continue
            core = hold.job or core_job(job_id, record.spec)
            model = GpuModel(hold.gpu_type) if hold.gpu_type is not None else None
            held.append(HeldJob(core, model, hold.owed, record.admitted_at.timestamp()))
        jobs += held_to_plan(held, mirror.snapshot(), MAX_HELD_PLANNED)
    return jobs


def plan_preemptions(state: PreemptionState, jobs: list[Job], *, now: datetime) -> list[Outgoing]:
    """Run the core's preempt and reclaim for ``jobs`` over the mirror; ask each plan's victims.

    The cycle is a what-if (the snapshot is left as it was, nothing is granted): its plans are what
    this service carries out.
    """
    mirror = state.mirror
    snap = mirror.snapshot()
    if not snap.nodes or not (snap.preemptible_running or _shrinkable_running(state)):
        return []  # no preemptible or elastic job running: the core's actions find no victim
    if state.planner is None:
        state.planner = planning_profile(mirror.profile)
    run_facts: dict[CoreJobId, RunFacts] = {}
    in_flight: set[CoreJobId] = set()
    for core_id in snap.running:
        record = mirror.jobs.get(JobId(core_id))
        live = record.live() if record is not None else None
        if live is None:
            continue
        facts = state.run_facts(live.job_id, live)
        if facts is not None:
            run_facts[core_id] = facts
        if (
            live.allocation_id in state.in_flight
            or live.allocation_id in state.asked
            or live.allocation_id in mirror.resizing
        ):
            in_flight.add(core_id)
    submit_time = {
        j.id: record.admitted_at.timestamp()
        for j in jobs
        if (record := mirror.jobs.get(JobId(j.id))) is not None and record.admitted_at is not None
    }
    ctx = build_context(
        snap,
        state.tree,
        now=now.timestamp(),
        submit_time=submit_time,
        run_facts=run_facts,
        policy=state.policy,
        in_flight=frozenset(in_flight),
    )
    _, decisions = run_queue_cycle(snap, jobs, state.planner, ctx, cycle=mirror.cycle)
    out: list[Outgoing] = []
    resizes = {r.job_id: r for r in decisions.resizes}
    for plan in decisions.preemptions:
        if plan.kind == SHRINK:
            out += _ask_to_shrink(state, plan, resizes, now=now)
        else:
            out += _carry_out(state, plan, now=now)
    return out


SHRINK = "shrink"
"""The kind of the elastic action's plans: its victims keep their first workers (``job.resizing``)."""


def _shrinkable_running(state: PreemptionState) -> bool:
    """Whether the planner shrinks elastic jobs and one runs above its fewest workers."""
    planner = state.planner or planning_profile(state.mirror.profile)
    if not any(a.name == ELASTIC for a in planner.actions):
        return False
    return any(
        r.job.min_workers is not None and len(r.allocation.placements) > r.job.fewest_workers
        for r in state.mirror.snapshot().running.values()
    )


def _ask_to_shrink(
    state: PreemptionState, plan: PreemptionPlan, resizes: dict[CoreJobId, Resize], *, now: datetime
) -> list[Outgoing]:
    """``job.resizing`` for each elastic job the core's shrink plan takes ranks from (checkpoint within
    its grace; :func:`finish_resize` then releases it ``resized`` and grants the ranks it keeps)."""
    out: list[Outgoing] = []
    for victim in plan.victims:
        resize = resizes.get(victim.job_id)
        record = state.mirror.jobs.get(JobId(victim.job_id))
        live = record.live() if record is not None else None
        if resize is None or record is None or live is None or record.spec is None:
            continue
        if live.allocation_id in state.mirror.resizing or live.allocation_id in state.asked:
            continue
        if live.allocation_id in record.ended or live.workers != resize.from_workers:
            continue  # it ended by itself, or runs at another size than the plan read
        target = Allocation(CoreAllocationId(live.allocation_id), resize.job_id, resize.placements)
        event = JobResizing(
            job_id=record.job_id,
            allocation_id=live.allocation_id,
            from_workers=resize.from_workers,
            to_workers=resize.to_workers,
            placements=wire_placements(target),
            deadline=now + timedelta(seconds=record.spec.checkpoint_grace_s),
            reason=f"job {plan.preemptor} needs the GPUs ({victim.reason})",
            preemptor_job_id=JobId(plan.preemptor),
        )
        envelope = _envelope(event, live.allocation_id, "resizing", now)
        state.fold(envelope)
        out.append((state.mirror.topics.events, envelope))
    return out


def finish_resize(state: PreemptionState, resize: JobResizing, *, now: datetime) -> list[Outgoing]:
    """The resize, once the job checkpointed (or its deadline passed): its allocation released
    ``resized`` and its new size granted, one transaction, the grant naming the allocation it replaces.

    Nothing when the allocation was released or its end read meanwhile (placement releases an end); a
    grow whose extra GPUs failed (or whose nodes were cordoned) meanwhile is granted its old placements."""
    record = state.mirror.jobs.get(resize.job_id)
    live = record.live() if record is not None else None
    if record is None or live is None or live.allocation_id != resize.allocation_id:
        state.mirror.resizing.pop(resize.allocation_id, None)
        return []
    if resize.allocation_id in record.ended:
        return []  # it ended by itself: placement releases it, which closes the resize
    placements = resize.placements
    snap = state.mirror.snapshot() if resize.grows else None  # a shrink never falls back
    if snap is not None and grow_falls_back(snap, core_allocation(live), core_placements(placements)):
        placements = live.placements  # a GPU it was to grow onto takes no work by now: back at its old size
    released = AllocationReleased(job_id=resize.job_id, allocation_id=resize.allocation_id, reason="resized")
    granted = AllocationGranted(
        job_id=resize.job_id,
        allocation_id=record.next_allocation_id(),
        queue=live.queue,
        gpu_type=live.gpu_type,
        placements=placements,
        resizes=resize.allocation_id,
    )
    release_envelope = _envelope(released, resize.allocation_id, "released-resized", now)
    grant_envelope = _envelope(granted, resize.allocation_id, "granted-resized", now)
    state.fold(release_envelope)
    state.fold(grant_envelope)
    topic = state.mirror.topics.allocations
    return [(topic, release_envelope), (topic, grant_envelope)]


RECLAIMS = "reclaims the quota its queue lent to the cohort"
"""How a ``job.preempting`` of a reclaim says why (the others: the preemptor needs the GPUs)."""


def preemption_reason(preempting: JobPreempting) -> str:
    """``reclaim`` (a lender takes its quota back) or ``priority`` (more urgent work needs the GPUs)."""
    return "reclaim" if RECLAIMS in preempting.reason else "priority"


def _carry_out(state: PreemptionState, plan: PreemptionPlan, *, now: datetime) -> list[Outgoing]:
    """``job.preempting`` for each victim of the core's plan still running and not asked already."""
    out: list[Outgoing] = []
    preemptor = JobId(plan.preemptor)
    for victim in plan.victims:
        record = state.mirror.jobs.get(JobId(victim.job_id))
        granted = record.live() if record is not None else None
        if record is None or granted is None:
            continue
        if granted.allocation_id in state.in_flight or granted.allocation_id in state.asked:
            continue
        if granted.allocation_id in record.ended:
            continue  # it ended by itself: its GPUs come free when placement releases it
        needs = RECLAIMS if plan.kind == RECLAIM else "needs the GPUs"
        why = f"{needs} ({victim.reason})"
        out.append(_ask(state, record, granted, preemptor, why, victim.lost_gpu_hours, now=now))
    return out


def lost_gpu_hours(state: PreemptionState, granted: AllocationGranted, now: datetime) -> float:
    """GPU-hours since the allocation's start or the job's last checkpoint, slices counted by share."""
    facts = state.run_facts(granted.job_id, granted)
    if facts is None:
        return 0.0
    snap = state.mirror.snapshot()
    running = snap.running.get(CoreJobId(granted.job_id))
    if running is not None:
        gpus = sum(gpu_share(snap, p) for p in running.allocation.placements)
    else:
        gpus = float(granted.whole_gpus)
    return facts.lost_hours(now.timestamp()) * gpus


def _ask(
    state: PreemptionState,
    victim: JobRecord,
    granted: AllocationGranted,
    preemptor: JobId,
    why: str,
    lost_hours: float,
    *,
    now: datetime,
) -> Outgoing:
    """``job.preempting`` for the victim's live allocation: checkpoint within its grace period, because
    ``preemptor`` ``why``; folded at once, so the same allocation is never asked twice."""
    assert victim.spec is not None
    grace = victim.spec.checkpoint_grace_s
    event = JobPreempting(
        job_id=victim.job_id,
        allocation_id=granted.allocation_id,
        deadline=now + timedelta(seconds=grace),
        reason=(
            f"job {preemptor} {why}; checkpoint within {grace} s (lose {lost_hours:.2f} GPU-hours otherwise)"
        ),
        preemptor_job_id=preemptor,
    )
    envelope = _envelope(event, granted.allocation_id, "preempting", now)
    state.fold(envelope)
    return (state.mirror.topics.events, envelope)


def finish(state: PreemptionState, flight: InFlight, *, checkpointed: bool, now: datetime) -> list[Outgoing]:
    """Release the victim's GPUs, say it was preempted, and requeue it to resume from its checkpoint."""
    record = state.mirror.jobs.get(flight.job_id)
    state.in_flight.pop(flight.allocation_id, None)
    if record is None:
        return []
    granted = record.grants.get(flight.allocation_id)
    if granted is None or flight.allocation_id in record.released or flight.allocation_id in record.ended:
        return []  # released already, or its end read (placement releases it)
    lost = 0.0 if checkpointed else lost_gpu_hours(state, granted, now)
    checkpoint = state.checkpoints.get(flight.job_id)
    released = AllocationReleased(
        job_id=flight.job_id, allocation_id=flight.allocation_id, reason="preempted"
    )
    preempted = JobPreempted(
        job_id=flight.job_id,
        allocation_id=flight.allocation_id,
        checkpointed=checkpointed,
        lost_gpu_seconds=Seconds(int(lost * 3600)),
    )
    requeued = JobRequeued(
        job_id=flight.job_id,
        reason="preempted",
        attempt=record.attempts_granted() + 1,
        resume_from=checkpoint[1] if checkpoint is not None else None,
    )
    topics = state.mirror.topics
    release_envelope = _envelope(released, flight.allocation_id, "released-preempted", now)
    requeue_envelope = _envelope(requeued, flight.allocation_id, "requeued-preempted", now)
    state.fold(release_envelope)
    state.fold(requeue_envelope)
    return [
        (topics.allocations, release_envelope),
        (topics.events, _envelope(preempted, flight.allocation_id, "preempted", now)),
        (topics.events, requeue_envelope),
    ]


def _envelope(event: Event, cause: str, kind: str, now: datetime) -> Envelope:
    return make_envelope(event, event_id=derived_id(cause, kind, event.subject()), source=SOURCE, time=now)
