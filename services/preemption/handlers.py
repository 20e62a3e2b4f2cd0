"""Preemption's decisions (pure): victims for a pending urgent job, checkpoint requests, release, requeue.

The service mirrors the cluster exactly as placement does (the same fold). When placement says a
job is pending for a reason other than quota, and running preemptible jobs of lower priority exist,
the core's victim search (:func:`gangline.core.actions.victims.find_victims`) picks the minimal set
losing the fewest GPU-hours since their last checkpoint whose release lets the whole gang fit.

The quota service plans its own preemptions: a job its queue is owed quota for, lent to other queues
of the cohort (reclaim), or a higher-priority job in a queue at its quota, gets a ``job.pending``
(code quota) whose ``details["victims"]`` names the jobs to stop. Those are asked here as they are
(:func:`preempt_named`), once each; quota checked they free enough quota, placement's victim search
does not apply (the job is not waiting for GPUs yet). Quota may name a victim whose grant this
service has not read yet (the two read allocations.log at their own pace): it is asked when the grant
is read, unless it was released meanwhile.

Each victim gets ``job.preempting`` with a deadline (now + its ``checkpoint_grace_s``). On the
agent's ``job.checkpointed``, or when the deadline passes (checked on every event consumed;
heartbeats are the clock), the victim's allocation is released (``preempted``), ``job.preempted``
says whether it checkpointed, and ``job.requeued`` sends it back to its queue to resume from the
checkpoint. Placement, seeing the release, places the urgent job first (it orders by priority).

The service folds every event of a poll (:func:`fold_event`) and searches for victims once per batch
(:func:`end_batch`), for each job found pending in it: under overload one search per pending event
burnt the CPU on searches whose answers the next event would change anyway. :func:`decide` does both
for a single event.

State is bounded by the live jobs: what is kept per allocation (start time, asked to checkpoint) is
dropped when the allocation is released, a job's last checkpoint when the mirror retires the job.
A re-delivered event about a released allocation or a retired job adds nothing back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gangline.bus import Outgoing
from gangline.core.actions.preempt import placement_oracle
from gangline.core.actions.victims import VictimCandidate, find_victims
from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import Session
from gangline.core.framework.profile import Profile
from gangline.core.model import JobId as CoreJobId
from gangline.core.model import NodeId as CoreNodeId
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
    JobRequeued,
)
from gangline.events.types import AllocationId, JobId, Seconds
from gangline.fold.adapter import core_job
from gangline.fold.cluster import ClusterFold, JobRecord
from services.common.topics import TopicNames

SOURCE = "gangline/preemption"


@dataclass
class InFlight:
    job_id: JobId
    allocation_id: AllocationId
    deadline: datetime
    preemptor: JobId


@dataclass(frozen=True)
class QuotaPlan:
    constraint: str
    victims: tuple[JobId, ...]
    planned_at: datetime
    """The time of quota's job.pending: a grant younger than that is not the one quota saw."""


@dataclass
class EarlyVictims:
    plan: QuotaPlan
    released: dict[JobId, frozenset[AllocationId]] = field(default_factory=dict)
    """Victim → its allocations released when the plan was read."""


@dataclass
class Mirror(ClusterFold):
    """The cluster as placement sees it (the one lifecycle fold), with what a victim search reads."""

    topics: TopicNames = field(default_factory=TopicNames)
    profile: Profile = field(default_factory=default_profile)
    cycle: int = 0


@dataclass
class PreemptionState:
    mirror: Mirror
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
    """Jobs placement said are pending (not for quota) since the last victim search, in order."""
    quota_plans: dict[JobId, QuotaPlan] = field(default_factory=dict)
    """Victims the quota service named for a job it holds (reclaim, or priority within its queue), since
    the last search, asked to checkpoint by :func:`end_batch`."""
    named_early: dict[JobId, EarlyVictims] = field(default_factory=dict)
    """Victims quota named before this mirror read their grant (quota read allocations.log further than
    preemption had), per waiting job. Each is asked once its grant is read, if that grant is not younger
    than the plan; forgotten when it is released meanwhile (quota's plan waited for that release),
    retires, or the waiter leaves the mirror or holds an allocation."""

    def restore(self, envelope: Envelope) -> None:
        self.fold(envelope)

    def fold(self, envelope: Envelope) -> None:
        self.mirror.fold(envelope)
        data = envelope.data
        if isinstance(data, AllocationGranted):
            if self._live(data.job_id, data.allocation_id):
                self.started_at.setdefault(data.allocation_id, envelope.time)
                waiting = self.asked_before_granted.pop(data.allocation_id, None)
                if waiting is not None:
                    self.in_flight.setdefault(data.allocation_id, waiting)
        elif isinstance(data, AllocationReleased):
            self.in_flight.pop(data.allocation_id, None)
            self.asked_before_granted.pop(data.allocation_id, None)
            self.started_at.pop(data.allocation_id, None)
            self.asked.discard(data.allocation_id)
            self._forget_if_retired(data.job_id)
        elif isinstance(data, JobCompleted | JobFailed):
            self._forget_if_retired(data.job_id)
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


def decide(envelope: Envelope, state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Fold one event and, when it leaves a job pending, search for victims at once."""
    return fold_event(envelope, state, now=now) + end_batch(state, now=now)


def fold_event(envelope: Envelope, state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Fold one event: finish checkpointed victims and those past their deadline; note pending jobs."""
    data = envelope.data
    state.fold(envelope)
    out: list[Outgoing] = []
    if isinstance(data, JobCheckpointed):
        flight = state.in_flight.get(data.allocation_id)
        if flight is not None:
            out += finish(state, flight, checkpointed=True, now=now)
    elif isinstance(data, JobPending):
        plan = _quota_plan(data)
        if plan is not None:
            state.quota_plans[data.job_id] = QuotaPlan(*plan, planned_at=envelope.time)
        elif not any(r.code == "quota" for r in data.reasons):
            state.pending[data.job_id] = None
    return out + finish_overdue(state, now=now)


def _quota_plan(pending: JobPending) -> tuple[str, tuple[JobId, ...]] | None:
    """The victims a quota pending names (``details["victims"]``: comma-separated job ids), if any."""
    for reason in pending.reasons:
        victims = reason.details.get("victims") if reason.code == "quota" else None
        if isinstance(victims, str) and victims:
            return reason.constraint, tuple(JobId(v) for v in victims.split(",") if v)
    return None


def finish_overdue(state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Release the victims whose deadline passed without a checkpoint (any event's time is the clock)."""
    out: list[Outgoing] = []
    for flight in sorted(state.in_flight.values(), key=lambda f: f.allocation_id):
        if now >= flight.deadline:
            out += finish(state, flight, checkpointed=False, now=now)
    return out


def end_batch(state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Search for victims for each job found pending since the last search, in the order they were."""
    out: list[Outgoing] = []
    plans = list(state.quota_plans.items())
    state.quota_plans.clear()
    for job_id, plan in plans:
        state.named_early.pop(job_id, None)  # the newer plan replaces the older
        out += preempt_named(state, job_id, plan.constraint, plan.victims, now=now, plan=plan)
    if state.named_early:
        out += _ask_named_early(state, now=now)
    if state.pending:
        jobs = list(state.pending)
        state.pending.clear()
        preemptible = _preemptible_running(state)
        for job_id in jobs:
            out += preempt_for(state, job_id, now=now, preemptible=preemptible)
    if out:
        out += finish_overdue(state, now=now)  # a victim with no grace period is released at once
    return out


def _preemptible_running(state: PreemptionState) -> list[tuple[JobRecord, AllocationGranted]]:
    """Running preemptible jobs and their live allocations (those asked already are filtered later)."""
    mirror = state.mirror
    found: list[tuple[JobRecord, AllocationGranted]] = []
    for running in mirror.snapshot().running.values():
        other = mirror.jobs.get(JobId(running.job.id))
        if other is None or other.spec is None or not other.spec.preemptible:
            continue
        live = other.live()
        if live is not None:
            found.append((other, live))
    return found


def lost_gpu_hours(state: PreemptionState, granted: AllocationGranted, now: datetime) -> float:
    since = state.started_at.get(granted.allocation_id, now)
    checkpoint = state.checkpoints.get(granted.job_id)
    if checkpoint is not None and checkpoint[0] > since:
        since = checkpoint[0]
    return float(granted.whole_gpus * max(0.0, (now - since).total_seconds()) / 3600)


def preempt_for(
    state: PreemptionState,
    job_id: JobId,
    *,
    now: datetime,
    preemptible: list[tuple[JobRecord, AllocationGranted]] | None = None,
) -> list[Outgoing]:
    """Ask the cheapest victim set to checkpoint so ``job_id`` fits; nothing when none would do.

    ``preemptible``: the running preemptible jobs (:func:`_preemptible_running`), when already listed.
    """
    mirror = state.mirror
    record = mirror.jobs.get(job_id)
    if record is None or record.spec is None or job_id not in mirror.waiting:
        return []
    if any(f.preemptor == job_id for f in state.in_flight.values()):
        return []  # already freeing room for it
    priority = record.spec.priority
    snap = mirror.snapshot()
    candidates: list[VictimCandidate] = []
    for other, live in preemptible if preemptible is not None else _preemptible_running(state):
        assert other.spec is not None
        if other.spec.priority >= priority:
            continue
        if live.allocation_id in state.in_flight or live.allocation_id in state.asked:
            continue
        per_node: dict[int, int] = {}
        for p in live.placements:
            i = snap.node_pos.get(CoreNodeId(p.node))
            if i is not None and not p.shared:
                per_node[i] = per_node.get(i, 0) + len(p.gpus)
        candidates.append(
            VictimCandidate(
                job_id=CoreJobId(other.job_id),
                lost_gpu_hours=lost_gpu_hours(state, live, now),
                gpus_by_node=tuple(sorted(per_node.items())),
                rank=(other.spec.priority,),
            )
        )
    if not candidates:
        return []
    job = core_job(job_id, record.spec)
    session = Session(snap, mirror.profile, [job], cycle=mirror.cycle)
    found = find_victims(snap, job, candidates, placement_oracle(session))
    if found is None:
        return []
    out: list[Outgoing] = []
    for victim in found.victims:
        victim_record = mirror.jobs[JobId(victim.job_id)]
        granted = victim_record.live()
        assert granted is not None
        why = f"(priority {priority}) needs the GPUs"
        out.append(_ask(state, victim_record, granted, job_id, why, victim.lost_gpu_hours, now=now))
    return out


def preempt_named(
    state: PreemptionState,
    job_id: JobId,
    constraint: str,
    victims: tuple[JobId, ...],
    *,
    now: datetime,
    plan: QuotaPlan | None = None,
) -> list[Outgoing]:
    """Ask the victims the quota service named for ``job_id`` to checkpoint.

    Quota chose them (jobs borrowing the cohort's quota that ``job_id``'s queue is owed, or lower-priority
    jobs of its own queue) and checked they free enough quota; here each one still running, preemptible
    and not asked already gets ``job.preempting``. One already gone is skipped: quota plans again once
    the releases it waits for have been read. One whose grant was not read yet is kept with ``plan``
    (:attr:`PreemptionState.named_early`).
    """
    mirror = state.mirror
    out: list[Outgoing] = []
    for victim_id in victims:
        victim = mirror.jobs.get(victim_id)
        if victim is None or victim.spec is None or not victim.spec.preemptible:
            continue
        granted = victim.live()
        if granted is None:
            if plan is not None:
                # Quota saw it running: its grant may not have been read here yet.
                early = state.named_early.setdefault(job_id, EarlyVictims(plan))
                early.released.setdefault(victim_id, frozenset(victim.released))
            continue
        if granted.allocation_id in state.in_flight or granted.allocation_id in state.asked:
            continue
        why = (
            "reclaims the quota its queue lent to the cohort"
            if constraint == "reclaim"
            else "has a higher priority in the same queue, which is at its quota"
        )
        lost = lost_gpu_hours(state, granted, now)
        out.append(_ask(state, victim, granted, job_id, why, lost, now=now))
    return out


def _ask_named_early(state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    """Ask the victims named before their grant was read whose grant has been read since."""
    out: list[Outgoing] = []
    for waiter, early in list(state.named_early.items()):
        record = state.mirror.jobs.get(waiter)
        if record is None or record.live() is not None:
            del state.named_early[waiter]  # finished, or placed: the plan is moot
            continue
        victims = early.released
        for victim_id, released in list(victims.items()):
            victim = state.mirror.jobs.get(victim_id)
            if victim is None or frozenset(victim.released) != released:
                del victims[victim_id]  # gone, or released since: the quota it held is free
                continue
            granted = victim.live()
            if granted is None:
                continue
            del victims[victim_id]
            granted_at = state.started_at.get(granted.allocation_id)
            if granted_at is not None and granted_at <= early.plan.planned_at:
                out += preempt_named(state, waiter, early.plan.constraint, (victim_id,), now=now)
            # else: granted after the plan, so not the allocation quota saw (that one was released
            # and the job placed again since): quota plans again if it still needs to
        if not victims:
            del state.named_early[waiter]
    return out


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
    if granted is None or flight.allocation_id in record.released:
        return []
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
        attempt=len(record.grants) + 1,
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
