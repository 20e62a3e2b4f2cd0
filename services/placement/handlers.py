"""Placement's decisions (pure): over the one lifecycle fold, run scheduling cycles, emit grants.

State is :class:`~gangline.fold.cluster.ClusterFold` (``nodes.inventory``, ``nodes.health``,
``jobs.events`` and ``allocations.log``, our own grants included, folded so the order between topics
does not matter) plus what placement keeps to decide: the profile, the cycle count, what each waiting
job was last told.

Placement also writes the release of a job that ended: the agents report the end on jobs.events
(``job.completed`` / ``job.failed`` naming the allocation), and the first batch that has folded the
end of a live allocation releases it (``allocation.released`` completed / failed, with the
``gpu_seconds`` the end reported), before its cycle, so the freed GPUs are placed in that cycle.
Its id is derived from the allocation, and an allocation already released (preempted, node_failed,
cancelled, or by us before a restart) is never released again. The batch's end decides it, not the
event, so a restore that finds a job ended while placement was down releases it on the first batch.

Each cycle is the core's (:func:`schedule`): the profile's actions over the snapshot, with the queue
facts of the fold. It emits, per placed gang, ``allocation.granted`` (one placement per rank) and
``job.placed``; per job left waiting, ``job.pending`` with the core's reasons when they change; per
elastic job the profile's ``elastic`` action grows into idle GPUs (only when nothing waits),
``job.resizing`` (:func:`grow`; preemption finishes the resize once the job checkpointed). While such a
job may grow, a batch that frees GPUs runs a cycle even when nothing waits.

A registration whose hardware the core cannot model leaves the node out (the fold's ``refused``):
:func:`fold_event` answers it with ``node.rejected`` on nodes.health (once per registration: our own
rejections are folded back), and the service dead-letters the registration with the same reason
(:func:`refused_registration`).

The service folds every event of a poll (:func:`fold_event`) and releases the ended allocations and
runs one cycle per batch (:func:`end_batch`); :func:`decide` does both for a single event.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gangline.bus import Outgoing
from gangline.core.actions.elastic import NAME as ELASTIC
from gangline.core.actions.queueing import PreemptionPolicy, Resize, placement_cycle
from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import apply_plan
from gangline.core.framework.profile import Profile
from gangline.core.framework.status import Reason
from gangline.core.model import Allocation
from gangline.core.model import AllocationId as CoreAllocationId
from gangline.core.model import JobId as CoreJobId
from gangline.core.resize import may_grow as may_grow_job
from gangline.core.waiting import FRONT_OF_LINE
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    DecisionReason,
    JobCancelRequested,
    JobCompleted,
    JobFailed,
    JobPending,
    JobPlaced,
    JobResizing,
    PendingReason,
)
from gangline.events.nodes import NodeRegistered, NodeRejected
from gangline.events.types import AllocationId, JobId, NodeId
from gangline.fold.adapter import wire_placements
from gangline.fold.cluster import ClusterFold
from services.common.topics import TopicNames

log = logging.getLogger(__name__)

SOURCE = "gangline/placement"
LIVE_POLICY = PreemptionPolicy(evict_in_cycle=False)
"""Placement plans no eviction and no shrink: the preemption service picks victims and runs the
checkpoint protocol. It grows elastic jobs into idle GPUs (it owns them): :func:`grow`."""
UNSUPPORTED_HARDWARE = "unsupported_hardware"
"""The ``node.rejected`` (and dead-letter) code of a node whose hardware the core cannot model."""


@dataclass
class PlacementState(ClusterFold):
    """The lifecycle fold, and what placement keeps to decide on it."""

    topics: TopicNames = field(default_factory=TopicNames)
    profile: Profile = field(default_factory=default_profile)
    max_jobs_per_cycle: int = FRONT_OF_LINE
    cycle: int = 0
    needs_cycle: bool = True
    """Set until the first event after a (re)start: jobs restored as waiting get a cycle then."""
    cycle_due: bool = False
    """An event folded since the last cycle may let a waiting job run (see :func:`end_batch`)."""


def decide(envelope: Envelope, state: PlacementState, *, now: datetime) -> list[Outgoing]:
    """Fold one event; when it may let jobs run, run a cycle and return its decisions."""
    outputs = fold_event(envelope, state, now=now)
    return outputs + end_batch(state, cause=envelope.id, now=now)


def fold_event(envelope: Envelope, state: PlacementState, *, now: datetime) -> list[Outgoing]:
    """Fold one event and note whether a cycle is due; only a cancellation has outputs of its own."""
    if isinstance(envelope.data, JobCancelRequested):
        outputs = cancel(envelope.data, state, cause=envelope.id, now=now)
        state.cycle_due = state.cycle_due or bool(outputs)
        return outputs
    changed = state.fold(envelope)
    state.cycle_due = state.cycle_due or changed or state.needs_cycle
    if isinstance(envelope.data, NodeRegistered):
        return reject_unmodelled(envelope, envelope.data, state, now=now)
    return []


def reject_unmodelled(
    envelope: Envelope, registered: NodeRegistered, state: PlacementState, *, now: datetime
) -> list[Outgoing]:
    """``node.rejected`` for a registration the fold refused, once per registration event.

    The service dead-letters the registration with the same reason (:func:`refused_registration`).
    """
    refused = state.refused.get(registered.node)
    if refused is None or refused[0] != envelope.id or envelope.id in state.rejections_sent:
        return []
    state.rejections_sent.add(envelope.id)
    rejected = NodeRejected(
        node=registered.node,
        code=UNSUPPORTED_HARDWARE,
        reason=f"node {registered.node} takes no work: {refused[1]}"[:2000],
        registration_id=envelope.id,
    )
    log.warning("refused the registration of node %s: %s", registered.node, refused[1])
    return [_out(state.topics.health, rejected, envelope.id, "node-rejected", now)]


def refused_registration(envelope: Envelope, outputs: Sequence[Outgoing]) -> tuple[str, str] | None:
    """The dead-letter code and reason of a registration whose outputs reject it (the bus's Refusal)."""
    for _, output in outputs:
        data = output.data
        if isinstance(data, NodeRejected) and data.registration_id == envelope.id:
            return data.code, data.reason
    return None


def end_batch(state: PlacementState, *, cause: str, now: datetime) -> list[Outgoing]:
    """The cycle the events folded since the last one call for (none when none is due), caused by ``cause``.

    First the allocations whose job ended are released (:func:`release_ended`), so the cycle can use
    their GPUs. One cycle sees every waiting job that could be placed (see :func:`schedule`).
    """
    outputs = release_ended(state, now=now)
    if not state.cycle_due or not (state.waiting or may_grow(state)):
        state.cycle_due = False
        return outputs
    state.cycle_due = False
    state.needs_cycle = False
    return outputs + schedule(state, cause=cause, now=now)


def may_grow(state: PlacementState) -> bool:
    """Whether the profile grows elastic jobs and one runs below its most workers, no resize in flight
    (then a cycle is worth running with nothing waiting: idle GPUs may grow it)."""
    if not any(a.name == ELASTIC for a in state.profile.actions):
        return False
    resizing = state.resizing_jobs()
    return any(may_grow_job(r) and r.job.id not in resizing for r in state.snapshot().running.values())


def release_ended(state: PlacementState, *, now: datetime) -> list[Outgoing]:
    """``allocation.released`` (completed / failed) for each live allocation whose job's end was read.

    The id is derived from the allocation alone, so a retry or a second run decides the same event;
    an allocation released meanwhile by anyone (its release folded) is not in ``to_release`` any more.
    """
    outputs: list[Outgoing] = []
    for job_id, allocation_id in sorted(state.to_release):
        record = state.jobs.get(job_id)
        end = record.ended.get(allocation_id) if record is not None else None
        if record is None or end is None or allocation_id in record.released:
            state.to_release.discard((job_id, allocation_id))
            continue
        released = AllocationReleased(
            job_id=job_id,
            allocation_id=allocation_id,
            reason="completed" if isinstance(end, JobCompleted) else "failed",
            gpu_seconds=end.gpu_seconds,
        )
        envelope = _out(state.topics.allocations, released, allocation_id, "released-ended", now)
        state.cycle_due = state.fold(envelope[1]) or state.cycle_due  # freed GPUs: the cycle may use them
        outputs.append(envelope)
    return outputs


def cancel(
    request: JobCancelRequested, state: PlacementState, *, cause: str, now: datetime
) -> list[Outgoing]:
    """A running job gives its GPUs back (released: cancelled); a waiting one is dropped. Both end failed."""
    record = state.jobs.get(request.job_id)
    if record is None or record.spec is None or record.finished:
        return []
    why = request.reason or "cancelled by request"
    if request.requested_by:
        why = f"{why} (by {request.requested_by})"
    outputs: list[Outgoing] = []
    live = record.live()
    if live is not None:
        released = AllocationReleased(
            job_id=record.job_id, allocation_id=live.allocation_id, reason="cancelled"
        )
        outputs.append(_out(state.topics.allocations, released, cause, "released-cancelled", now))
        failed = JobFailed(
            job_id=record.job_id, allocation_id=live.allocation_id, code="cancelled_while_running", reason=why
        )
    else:
        failed = JobFailed(job_id=record.job_id, code="cancelled", reason=why)
    outputs.append(_out(state.topics.events, failed, cause, "failed-cancelled", now))
    for _, envelope in outputs:
        state.fold(envelope)
    return outputs


def schedule(state: PlacementState, *, cause: str, now: datetime) -> list[Outgoing]:
    """One scheduling cycle over the waiting jobs; the events that announce its decisions.

    The core decides (:func:`~gangline.core.actions.queueing.placement_cycle`, the cycle the core's
    simulator runs too): the profile's actions (reserve, allocate, backfill, ...) over the snapshot,
    with the queue facts of :meth:`PlacementState.queue_context`. It sees the first
    ``max_jobs_per_cycle`` jobs in line and every later one the free GPUs could hold
    (:func:`~gangline.core.waiting.cycle_jobs`), so no blocked front strands a job that fits.
    """
    snap = state.snapshot()
    if not snap.nodes:
        return []
    waiting = [job for r in state.waiting.values() if (job := r.core()) is not None]
    admitted_at = {
        CoreJobId(r.job_id): r.admitted_at.timestamp() for r in state.waiting.values() if r.admitted_at
    }

    def allocation_id(job: CoreJobId, cycle: int) -> CoreAllocationId:
        return CoreAllocationId(state.jobs[JobId(job)].next_allocation_id())

    state.cycle += 1
    plan, decisions = placement_cycle(
        snap,
        waiting,
        admitted_at,
        state.profile,
        lambda jobs: state.queue_context(snap, jobs, now=now, policy=LIVE_POLICY),
        head=state.max_jobs_per_cycle,
        cycle=state.cycle,
        allocation_id=allocation_id,
    )
    problems = apply_plan(snap, plan)
    if problems:
        log.error("a plan could not be applied: %s", [p.message for p in problems])
    outputs: list[Outgoing] = []
    for placed in plan.placed:
        job_id = JobId(placed.job.id)
        record = state.jobs[job_id]
        spec = record.spec
        assert spec is not None
        granted = AllocationGranted(
            job_id=job_id,
            allocation_id=AllocationId(placed.allocation.id),
            queue=spec.queue,
            gpu_type=spec.gpu_type,
            placements=wire_placements(placed.allocation),
        )
        job_placed = JobPlaced(
            job_id=job_id,
            allocation_id=granted.allocation_id,
            nodes=tuple(NodeId(n) for n in placed.allocation.nodes),
            cycle=state.cycle,
            score=placed.score,
            reasons=tuple(_decision_reason(r) for r in placed.reasons),
        )
        record.grants[granted.allocation_id] = granted
        record.granted_at.setdefault(granted.allocation_id, now)
        state._refresh(record)
        outputs.append(_out(state.topics.allocations, granted, cause, "granted", now))
        outputs.append(_out(state.topics.events, job_placed, cause, "placed", now))
    outputs += grow(state, decisions.resizes, cause=cause, now=now)
    for pending in plan.pending:
        job_id = JobId(pending.job_id)
        reasons = tuple(_pending_reason(r) for r in pending.reasons) or (
            PendingReason(code="capacity", constraint="placement", message="no placement fits right now"),
        )
        key = tuple(f"{r.code}:{r.message}" for r in reasons)
        if state.last_pending.get(job_id) == key:
            continue
        state.last_pending[job_id] = key
        event = JobPending(job_id=job_id, cycle=state.cycle, reasons=reasons)
        outputs.append(_out(state.topics.events, event, cause, "pending", now))
    return outputs


def grow(state: PlacementState, resizes: Sequence[Resize], *, cause: str, now: datetime) -> list[Outgoing]:
    """``job.resizing`` for each grow the cycle decided: the job is asked to checkpoint, and its extra GPUs
    are held for it (the fold, folded at once) until preemption releases it ``resized`` and grants the new
    size. Placement only grows (its policy plans no shrink: preemption does, for waiting jobs)."""
    outputs: list[Outgoing] = []
    for resize in resizes:
        record = state.jobs.get(JobId(resize.job_id))
        live = record.live() if record is not None else None
        if record is None or live is None or record.spec is None or resize.to_workers <= resize.from_workers:
            continue
        target = Allocation(CoreAllocationId(live.allocation_id), resize.job_id, resize.placements)
        event = JobResizing(
            job_id=record.job_id,
            allocation_id=live.allocation_id,
            from_workers=resize.from_workers,
            to_workers=resize.to_workers,
            placements=wire_placements(target),
            deadline=now + timedelta(seconds=record.spec.checkpoint_grace_s),
            reason=(
                f"elastic {record.job_id} grows from {resize.from_workers} to {resize.to_workers} "
                "workers on idle GPUs"
            ),
        )
        envelope = _out(state.topics.events, event, cause, "resizing", now)
        state.fold(envelope[1])
        outputs.append(envelope)
    return outputs


def _out(topic: str, event: Event, cause: str, kind: str, now: datetime) -> Outgoing:
    envelope = make_envelope(
        event, event_id=derived_id(cause, kind, event.subject()), source=SOURCE, time=now
    )
    return (topic, envelope)


def _decision_reason(reason: Reason) -> DecisionReason:
    return DecisionReason(plugin=reason.plugin or "placement", message=reason.message or reason.code.value)


def _pending_reason(reason: Reason) -> PendingReason:
    details = {k[:64]: v for k, v in reason.details.items() if isinstance(v, int | str) and k}
    return PendingReason(
        code=reason.code.value,
        constraint=(reason.plugin or "placement")[:128],
        message=(reason.message or reason.code.value)[:2000],
        details=details,
    )
