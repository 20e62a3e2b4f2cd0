"""Preemption's decisions (pure): victims for a pending urgent job, checkpoint requests, release, requeue.

The service mirrors the cluster exactly as placement does (the same fold). When placement says a
job is pending for a reason other than quota, and running preemptible jobs of lower priority exist,
the core's victim search (:func:`gangline.core.actions.victims.find_victims`) picks the minimal set
losing the fewest GPU-hours since their last checkpoint whose release lets the whole gang fit.

Each victim gets ``job.preempting`` with a deadline (now + its ``checkpoint_grace_s``). On the
agent's ``job.checkpointed``, or when the deadline passes (checked on every event consumed;
heartbeats are the clock), the victim's allocation is released (``preempted``), ``job.preempted``
says whether it checkpointed, and ``job.requeued`` sends it back to its queue to resume from the
checkpoint. Placement, seeing the release, places the urgent job first (it orders by priority).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gangline.bus import Outgoing
from gangline.core.actions.preempt import placement_oracle
from gangline.core.actions.victims import VictimCandidate, find_victims
from gangline.core.framework.cycle import Session
from gangline.core.model import JobId as CoreJobId
from gangline.core.model import NodeId as CoreNodeId
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobCheckpointed, JobPending, JobPreempted, JobPreempting, JobRequeued
from gangline.events.types import AllocationId, JobId, Seconds
from services.common.ids import derived_id
from services.placement.convert import core_job
from services.placement.handlers import PlacementState

SOURCE = "gangline/preemption"


@dataclass
class InFlight:
    job_id: JobId
    allocation_id: AllocationId
    deadline: datetime
    preemptor: JobId


@dataclass
class PreemptionState:
    mirror: PlacementState
    started_at: dict[AllocationId, datetime] = field(default_factory=dict)
    checkpoints: dict[JobId, tuple[datetime, str]] = field(default_factory=dict)
    in_flight: dict[AllocationId, InFlight] = field(default_factory=dict)
    asked: set[AllocationId] = field(default_factory=set)
    """Allocations asked to checkpoint, ever (so a restart never asks twice)."""

    def restore(self, envelope: Envelope) -> None:
        self.fold(envelope)

    def fold(self, envelope: Envelope) -> None:
        self.mirror.fold(envelope)
        data = envelope.data
        if isinstance(data, AllocationGranted):
            self.started_at.setdefault(data.allocation_id, envelope.time)
        elif isinstance(data, AllocationReleased):
            self.in_flight.pop(data.allocation_id, None)
        elif isinstance(data, JobCheckpointed):
            self.checkpoints[data.job_id] = (envelope.time, data.checkpoint)
        elif isinstance(data, JobPreempting):
            self.asked.add(data.allocation_id)
            record = self.mirror.jobs.get(data.job_id)
            live = record.live() if record is not None else None
            if live is not None and live.allocation_id == data.allocation_id:
                self.in_flight.setdefault(
                    data.allocation_id,
                    InFlight(
                        data.job_id,
                        data.allocation_id,
                        data.deadline,
                        data.preemptor_job_id or JobId("unknown"),
                    ),
                )


def decide(envelope: Envelope, state: PreemptionState, *, now: datetime) -> list[Outgoing]:
    data = envelope.data
    state.fold(envelope)
    out: list[Outgoing] = []
    if isinstance(data, JobCheckpointed):
        flight = state.in_flight.get(data.allocation_id)
        if flight is not None:
            out += finish(state, flight, checkpointed=True, now=now)
    elif isinstance(data, JobPending) and not any(r.code == "quota" for r in data.reasons):
        out += preempt_for(state, data.job_id, now=now)
    for flight in sorted(state.in_flight.values(), key=lambda f: f.allocation_id):
        if now >= flight.deadline:
            out += finish(state, flight, checkpointed=False, now=now)
    return out


def lost_gpu_hours(state: PreemptionState, granted: AllocationGranted, now: datetime) -> float:
    since = state.started_at.get(granted.allocation_id, now)
    checkpoint = state.checkpoints.get(granted.job_id)
    if checkpoint is not None and checkpoint[0] > since:
        since = checkpoint[0]
    return float(granted.whole_gpus * max(0.0, (now - since).total_seconds()) / 3600)


def preempt_for(state: PreemptionState, job_id: JobId, *, now: datetime) -> list[Outgoing]:
    """Ask the cheapest victim set to checkpoint so ``job_id`` fits; nothing when none would do."""
    mirror = state.mirror
    record = mirror.jobs.get(job_id)
    if record is None or record.spec is None or job_id not in mirror.waiting:
        return []
    if any(f.preemptor == job_id for f in state.in_flight.values()):
        return []  # already freeing room for it
    priority = record.spec.priority
    snap = mirror.snapshot()
    candidates: list[VictimCandidate] = []
    for running in snap.running.values():
        other = mirror.jobs.get(JobId(running.job.id))
        if other is None:
            continue
        live = other.live()
        if (
            live is None
            or other.spec is None
            or not other.spec.preemptible
            or other.spec.priority >= priority
        ):
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
        live = victim_record.live()
        assert live is not None and victim_record.spec is not None
        grace = victim_record.spec.checkpoint_grace_s
        event = JobPreempting(
            job_id=victim_record.job_id,
            allocation_id=live.allocation_id,
            deadline=now + timedelta(seconds=grace),
            reason=(
                f"job {job_id} (priority {priority}) needs the GPUs; checkpoint within {grace} s "
                f"(lose {victim.lost_gpu_hours:.2f} GPU-hours otherwise)"
            ),
            preemptor_job_id=job_id,
        )
        envelope = _envelope(event, live.allocation_id, "preempting", now)
        state.fold(envelope)
        out.append((state.mirror.topics.events, envelope))
    return out


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
