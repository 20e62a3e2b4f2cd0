"""The ledger's projections as pure folds: events in, the row they imply out (no I/O).

- A job's row is a fold over all of the job's events (jobs.requests, jobs.events, allocations.log),
  in time order. The three topics are read independently, so a job's admission may be read before
  its request; folding the job's whole history each time makes the row independent of that order.
- A node's row is updated one event at a time: heartbeats are many, and each node event carries
  everything its change needs. A state change older than the one already applied is ignored.
- A queue's status row is quota's latest ``queue.status`` (by ``as_of``): quota's fair-share figure,
  copied, never computed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import Event
from gangline.events.jobs import JobState
from gangline.events.registry import JOB_EVENT_TYPES

TERMINAL_STATES: frozenset[JobState] = frozenset({"rejected", "completed", "failed", "cancelled"})

# Which state each lifecycle event moves a job to; events not listed leave the state alone.
_STATE_OF: dict[type[Event], JobState] = {
    jobs.JobRequested: "requested",
    jobs.JobAdmitted: "admitted",
    jobs.JobRejected: "rejected",
    jobs.JobQueued: "queued",
    jobs.JobPending: "pending",
    jobs.JobPlaced: "placed",
    jobs.JobStarted: "running",
    jobs.JobPreempting: "preempting",
    jobs.JobResizing: "resizing",
    jobs.JobPreempted: "preempted",
    jobs.JobRequeued: "requeued",
    jobs.JobCompleted: "completed",
    jobs.JobFailed: "failed",
}


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of the ledger, typed again: what the folds read."""

    event_id: str
    time: datetime
    data: Event


@dataclass(frozen=True, slots=True)
class JobRow:
    """The `jobs` projection row of one job."""

    job_id: str
    queue: str
    state: str
    priority: int
    workers: int
    gpus_per_worker: int
    gpu_type: str | None
    gpu_memory_mib: int | None
    mig_profile: str | None
    topology: dict[str, Any] | None
    preemptible: bool
    spec: dict[str, Any]
    submitted_at: datetime
    updated_at: datetime
    last_event_id: str
    submitted_by: str | None = None
    reason: str | None = None
    reason_code: str | None = None
    pending_reasons: tuple[dict[str, Any], ...] = ()
    admitted_at: datetime | None = None
    placed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    allocation_id: str | None = None
    attempt: int = 1
    cancel_requested_at: datetime | None = None
    gpu_model: str | None = None
    """The GPU model of the latest grant (``allocation.granted``), else the one quota charged
    (``job.queued``), else the job's own ``gpu_type``."""
    granted_at: datetime | None = None
    """The first grant: ``granted_at - admitted_at`` is the job's first wait."""
    gpu_seconds: float = 0.0
    """GPU-seconds held over every attempt: each release's own figure when it reports one, else its
    held time times the grant's GPUs (:attr:`AllocationGranted.gpu_share`)."""
    final_state: str | None = None
    """completed, failed, cancelled or rejected once the job ended; None while it lives."""
    held: tuple[tuple[str, datetime, float], ...] = ()
    """(allocation id, granted at, GPUs) of each grant read: what a release is charged by (not a column)."""
    released: frozenset[str] = frozenset()
    """Allocations whose release was counted (not a column)."""


def _spec_row(job_id: str, spec: jobs.JobSpec, *, at: StoredEvent) -> JobRow:
    return JobRow(
        job_id=job_id,
        queue=spec.queue,
        state="requested",
        priority=spec.priority,
        workers=spec.workers,
        gpus_per_worker=spec.gpus_per_worker,
        gpu_type=spec.gpu_type,
        gpu_memory_mib=spec.gpu_memory_mib,
        mig_profile=spec.mig_profile,
        topology=spec.topology.model_dump(mode="json") if spec.topology is not None else None,
        preemptible=spec.preemptible,
        spec=spec.model_dump(mode="json"),
        submitted_at=at.time,
        updated_at=at.time,
        last_event_id=at.event_id,
        submitted_by=spec.submitted_by,
        gpu_model=spec.gpu_type,
    )


def _order(event: StoredEvent) -> tuple[datetime, int]:
    # At equal times the request comes first: nothing can happen to a job before it is asked for; and a
    # release comes last, after the grant of the same instant it is charged by.
    if isinstance(event.data, jobs.JobRequested):
        return event.time, 0
    return event.time, 2 if isinstance(event.data, allocations.AllocationReleased) else 1


def fold_job(job_id: str, events: Iterable[StoredEvent]) -> JobRow | None:
    """The job's row after ``events`` (any order); None until its spec is known (request or admission)."""
    history = sorted(events, key=_order)
    row: JobRow | None = None
    for event in history:
        data = event.data
        if row is None:
            if isinstance(data, jobs.JobRequested):
                row = _spec_row(job_id, data.spec(), at=event)
            elif isinstance(data, jobs.JobAdmitted):
                row = _spec_row(job_id, data.spec, at=event)
            else:
                continue
        row = _apply_job_event(row, event)
    if row is None:
        return None
    return replace(row, final_state=row.state if row.state in TERMINAL_STATES else None)


def _account(row: JobRow, event: StoredEvent) -> dict[str, Any]:
    """What a grant or a release changes in the job's accounting columns."""
    data = event.data
    if isinstance(data, jobs.JobAdmitted):
        return {"gpu_model": row.gpu_model or data.spec.gpu_type}
    if isinstance(data, jobs.JobQueued) and data.gpu_type is not None:
        return {"gpu_model": data.gpu_type}
    if isinstance(data, allocations.AllocationGranted):
        if any(a == data.allocation_id for a, _, _ in row.held):
            return {}
        return {
            "held": (*row.held, (data.allocation_id, event.time, data.gpu_share)),
            "granted_at": min(row.granted_at or event.time, event.time),
            "gpu_model": data.gpu_type or row.gpu_model,
        }
    if isinstance(data, allocations.AllocationReleased) and data.allocation_id not in row.released:
        grant = next((g for g in row.held if g[0] == data.allocation_id), None)
        if data.gpu_seconds is not None:
            used = float(data.gpu_seconds)
        elif grant is not None:
            used = max(0.0, (event.time - grant[1]).total_seconds()) * grant[2]
        else:
            return {}  # no grant read, no figure: charged once the grant is in the history
        return {"gpu_seconds": row.gpu_seconds + used, "released": row.released | {data.allocation_id}}
    return {}


def _apply_job_event(row: JobRow, event: StoredEvent) -> JobRow:
    data = event.data
    changes: dict[str, Any] = {"updated_at": max(row.updated_at, event.time), "last_event_id": event.event_id}
    changes |= _account(row, event)
    if isinstance(data, jobs.JobRequested):
        changes["submitted_at"] = min(row.submitted_at, event.time)
        changes["submitted_by"] = data.submitted_by or row.submitted_by
    elif isinstance(data, jobs.JobCancelRequested):
        changes["cancel_requested_at"] = row.cancel_requested_at or event.time
    elif isinstance(data, allocations.AllocationGranted):
        changes["allocation_id"] = data.allocation_id
    elif (
        isinstance(data, allocations.AllocationReleased)
        and data.reason == "cancelled"
        and row.state not in TERMINAL_STATES
    ):
        changes |= {"state": "cancelled", "finished_at": event.time}
    new_state = _STATE_OF.get(type(data))
    if new_state is None or row.state in TERMINAL_STATES:
        return replace(row, **changes)
    changes["state"] = new_state
    # The reason describes the current state only: pending, rejected or failed.
    changes |= {"reason": None, "reason_code": None}
    if isinstance(data, jobs.JobAdmitted):
        changes["admitted_at"] = event.time
    elif isinstance(data, jobs.JobPending):
        first = data.reasons[0]
        changes |= {
            "reason": first.message,
            "reason_code": first.code,
            "pending_reasons": tuple(r.model_dump(mode="json") for r in data.reasons),
        }
    elif isinstance(data, jobs.JobRejected):
        changes |= {"reason": data.reason, "reason_code": data.code, "finished_at": event.time}
    elif isinstance(data, jobs.JobPlaced):
        changes |= {"placed_at": event.time, "allocation_id": data.allocation_id, "pending_reasons": ()}
    elif isinstance(data, jobs.JobStarted):
        changes |= {"started_at": event.time, "attempt": data.attempt, "allocation_id": data.allocation_id}
    elif isinstance(data, jobs.JobPreempting):
        changes |= {"reason": data.reason, "reason_code": "preempting"}
    elif isinstance(data, jobs.JobResizing):
        changes |= {"reason": data.reason, "reason_code": "resizing"}
    elif isinstance(data, jobs.JobRequeued):
        changes |= {"attempt": data.attempt, "reason": f"requeued: {data.reason}", "reason_code": data.reason}
    elif isinstance(data, jobs.JobCompleted):
        changes["finished_at"] = event.time
    elif isinstance(data, jobs.JobFailed):
        cancelled = data.code.startswith("cancel")
        changes |= {
            "state": "cancelled" if cancelled else "failed",
            "reason": data.reason,
            "reason_code": data.code,
            "finished_at": event.time,
        }
    return replace(row, **changes)


# -- nodes ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRow:
    """The `nodes` projection row of one node."""

    node: str
    state: str
    updated_at: datetime
    last_event_id: str
    gpu_count: int = 0
    gpu_model: str | None = None
    gpus: tuple[dict[str, Any], ...] = ()
    nvlink_domain: str | None = None
    leaf: str | None = None
    spine: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    health_reason: str | None = None
    registered_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    last_seq: int | None = None
    gpu_health: Mapping[str, str] = field(default_factory=dict)
    state_changed_at: datetime | None = None

    @property
    def cordoned_gpus(self) -> list[str]:
        """GPUs whose last reported health is failed: no new work goes there."""
        return sorted(gpu for gpu, health in self.gpu_health.items() if health == "failed")


def _health_state(gpu_health: Mapping[str, str]) -> str:
    return "ready" if all(h == "healthy" for h in gpu_health.values()) else "unhealthy"


def apply_node_event(row: NodeRow | None, node: str, event: StoredEvent) -> NodeRow:
    """Node ``node``'s row after one more event (``row`` None: the first event seen for it)."""
    data = event.data
    if row is None:
        row = NodeRow(node=node, state="unregistered", updated_at=event.time, last_event_id=event.event_id)
    row = replace(row, updated_at=max(row.updated_at, event.time), last_event_id=event.event_id)
    newer = row.state_changed_at is None or event.time >= row.state_changed_at
    if isinstance(data, nodes.NodeRegistered):
        models = [gpu.model for gpu in data.gpus]
        row = replace(
            row,
            gpu_count=len(data.gpus),
            gpu_model=max(set(models), key=models.count) if models else None,
            gpus=tuple(gpu.model_dump(mode="json") for gpu in data.gpus),
            nvlink_domain=data.nvlink_domain,
            leaf=data.leaf,
            spine=data.spine,
            labels=dict(data.labels),
            registered_at=event.time,
        )
        if newer:
            row = replace(
                row,
                state=_health_state(row.gpu_health),
                health_reason=None,
                state_changed_at=event.time,
            )
    elif isinstance(data, nodes.NodeHeartbeat | nodes.NodeHeartbeatV1):
        if row.last_heartbeat_at is None or event.time >= row.last_heartbeat_at:
            row = replace(row, last_heartbeat_at=event.time, last_seq=data.seq)
    elif isinstance(data, nodes.GpuHealthChanged):
        gpu_health = {**row.gpu_health, data.gpu: data.state}
        row = replace(row, gpu_health=gpu_health)
        if newer and row.state not in ("lost", "unregistered"):
            state = _health_state(gpu_health)
            row = replace(
                row,
                state=state,
                health_reason=None if state == "ready" else f"{data.gpu}: {data.cause.message}",
                state_changed_at=event.time,
            )
    elif isinstance(data, nodes.NodeFailed) and newer:
        row = replace(row, state="lost", health_reason=data.reason, state_changed_at=event.time)
    return row


# -- queues -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueStatusRow:
    """The `queue_status` projection row of one queue: quota's latest figures for it."""

    queue: str
    cohort: str
    weight: float
    dominant_share: float
    dominant_resource: str | None
    position: int
    ranked_among: int
    resources: Mapping[str, Mapping[str, int]]
    as_of: datetime
    event_id: str
    updated_at: datetime


def queue_status_row(event: StoredEvent) -> QueueStatusRow | None:
    """The row a ``queue.status`` implies; None for any other event."""
    data = event.data
    if not isinstance(data, queues.QueueStatus):
        return None
    return QueueStatusRow(
        queue=data.queue,
        cohort=data.cohort,
        weight=data.weight,
        dominant_share=data.dominant_share,
        dominant_resource=data.dominant_resource,
        position=data.position,
        ranked_among=data.of,
        resources={r: v.model_dump(mode="json") for r, v in sorted(data.resources.items())},
        as_of=data.as_of,
        event_id=event.event_id,
        updated_at=event.time,
    )


def newer_status(row: QueueStatusRow | None, candidate: QueueStatusRow) -> bool:
    """Whether ``candidate`` replaces ``row``: the latest ``as_of`` wins (a tie: the one read later)."""
    return row is None or candidate.as_of >= row.as_of


def job_subjects(events: Sequence[tuple[str, str]]) -> list[str]:
    """The distinct job ids among ``(wire type, subject)`` pairs, in first-seen order."""
    seen: dict[str, None] = {}
    for wire_type, subject in events:
        # Rejections of unreadable requests share one placeholder subject; there is no job to fold.
        if wire_type in JOB_EVENT_TYPES and subject != jobs.UNKNOWN_JOB:
            seen.setdefault(subject, None)
    return list(seen)
