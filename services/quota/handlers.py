"""Quota's decisions (pure): which admitted jobs may go to placement now, and why the others wait.

A job is charged to its queue (its whole GPUs) from the moment it is queued until its allocation is
released for good (completed, failed, cancelled). A job admitted while the charge would pass the
queue's limit gets ``job.pending`` (code ``quota``) and waits; each final release lets the queue's
waiting jobs through, highest priority first, then oldest. A requeued job (preempted, node failed)
stays charged and is queued again at once.

State is a fold over ``jobs.events`` and ``allocations.log``, our own ``job.queued`` included, and
does not depend on the order between the two topics: per job it counts queued events against the
attempts it is owed (one, plus one per ``job.requeued``).

A finished job's charge never changes again, so its record is dropped and only its id is kept
(``retired``): state is bounded by the live jobs plus one id per finished job, and any event about a
finished job read again (a retried batch, a restart, the other topic catching up) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from gangline.bus import Outgoing
from gangline.events.allocations import AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobFailed,
    JobPending,
    JobQueued,
    JobRequeued,
    JobSpec,
    PendingReason,
)
from gangline.events.types import AllocationId, JobId, QueueName
from services.common.ids import derived_id
from services.common.topics import TopicNames

SOURCE = "gangline/quota"
FINAL_RELEASES = frozenset({"completed", "failed", "cancelled"})
_NEVER = datetime.max.replace(tzinfo=UTC)
QUOTA_EVENT_TYPES = (JobAdmitted, JobQueued, JobRequeued, AllocationReleased, JobFailed)


@dataclass
class QuotaJob:
    job_id: JobId
    spec: JobSpec | None = None
    queued: set[str] = field(default_factory=set)
    owed: int = 1
    finished: bool = False
    released: set[AllocationId] = field(default_factory=set)
    admitted_at: datetime | None = None
    """The job.admitted event's time: with the priority and the job id, the order waiting jobs are let
    through. Read from the log, so it does not depend on how a restore or a poll interleaved partitions."""

    @property
    def gpus(self) -> int:
        return self.spec.total_gpus if self.spec is not None else 0

    @property
    def charged(self) -> bool:
        return self.spec is not None and bool(self.queued) and not self.finished

    @property
    def waiting(self) -> bool:
        return self.spec is not None and not self.finished and len(self.queued) < self.owed


@dataclass
class QuotaState:
    topics: TopicNames
    limits: dict[str, int | None]
    jobs: dict[JobId, QuotaJob] = field(default_factory=dict)
    usage: dict[QueueName, int] = field(default_factory=dict)
    waiting: dict[QueueName, dict[JobId, QuotaJob]] = field(default_factory=dict)
    """Jobs owed a job.queued, per queue (kept up to date by ``fold``)."""
    retired: set[JobId] = field(default_factory=set)
    """Finished jobs, dropped from ``jobs``: nothing read about them any more changes the state."""

    def restore(self, envelope: Envelope) -> None:
        self.fold(envelope)

    def limit(self, queue: str) -> int | None:
        return self.limits.get(queue)

    def fold(self, envelope: Envelope) -> QuotaJob | None:
        """Apply one fact; the job it touched (None when the event is not about quota)."""
        job = self._fold(envelope)
        if job is not None and job.spec is not None:
            queue = self.waiting.setdefault(QueueName(job.spec.queue), {})
            if job.waiting:
                queue[job.job_id] = job
            else:
                queue.pop(job.job_id, None)
        if job is not None and job.finished:
            self.jobs.pop(job.job_id, None)
            self.retired.add(job.job_id)
        return job

    def _fold(self, envelope: Envelope) -> QuotaJob | None:
        data = envelope.data
        if isinstance(data, QUOTA_EVENT_TYPES) and data.job_id in self.retired:
            return None
        if isinstance(data, JobAdmitted):
            job = self._job(data.job_id)
            if job.spec is None:
                was = job.charged
                job.spec = data.spec
                job.admitted_at = envelope.time
                self._recharge(job, was)
            return job
        if isinstance(data, JobQueued):
            job = self._job(data.job_id)
            was = job.charged
            job.queued.add(envelope.id)
            self._recharge(job, was)
            return job
        if isinstance(data, JobRequeued):
            job = self._job(data.job_id)
            job.owed = max(job.owed, data.attempt)
            return job
        if isinstance(data, AllocationReleased):
            job = self._job(data.job_id)
            if data.allocation_id in job.released:
                return None
            job.released.add(data.allocation_id)
            if data.reason in FINAL_RELEASES:
                was = job.charged
                job.finished = True
                self._recharge(job, was)
            return job
        if isinstance(data, JobFailed):
            job = self._job(data.job_id)
            was = job.charged
            job.finished = True
            self._recharge(job, was)
            return job
        return None

    def _job(self, job_id: JobId) -> QuotaJob:
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = QuotaJob(job_id)
        return job

    def _recharge(self, job: QuotaJob, was_charged: bool) -> None:
        if job.spec is None or was_charged == job.charged:
            return
        queue = QueueName(job.spec.queue)
        delta = job.gpus if job.charged else -job.gpus
        self.usage[queue] = self.usage.get(queue, 0) + delta

    def fits(self, job: QuotaJob) -> bool:
        assert job.spec is not None
        limit = self.limit(job.spec.queue)
        return limit is None or self.usage.get(QueueName(job.spec.queue), 0) + job.gpus <= limit


def decide(envelope: Envelope, state: QuotaState, *, now: datetime) -> list[Outgoing]:
    job = state.fold(envelope)
    if job is None or job.spec is None:
        return []
    data = envelope.data
    if isinstance(data, JobAdmitted | JobRequeued):
        if not job.waiting:
            return []
        limit = state.limit(job.spec.queue)
        if not job.charged and limit is not None and job.gpus > limit:
            return [_never(state, job, limit, envelope.id, now)]
        if job.charged or state.fits(job):
            return [_queue(state, job, envelope.id, now)]
        return [_pending(state, job, envelope.id, now)]
    if isinstance(data, AllocationReleased | JobFailed) and job.finished:
        return _let_through(state, job.spec.queue, envelope.id, now)
    return []


def _let_through(state: QuotaState, queue: str, cause: str, now: datetime) -> list[Outgoing]:
    waiting = sorted(
        state.waiting.get(QueueName(queue), {}).values(),
        key=lambda j: (
            -(j.spec.priority if j.spec is not None else 0),
            j.admitted_at if j.admitted_at is not None else _NEVER,
            j.job_id,
        ),
    )
    out: list[Outgoing] = []
    for job in waiting:
        if state.fits(job):
            out.append(_queue(state, job, cause, now))
    return out


def _queue(state: QuotaState, job: QuotaJob, cause: str, now: datetime) -> Outgoing:
    assert job.spec is not None
    event = JobQueued(job_id=job.job_id, queue=QueueName(job.spec.queue))
    envelope = _envelope(event, cause, "queued", now)
    state.fold(envelope)  # charge it now, so the next decision sees it
    return (state.topics.events, envelope)


def _never(state: QuotaState, job: QuotaJob, limit: int, cause: str, now: datetime) -> Outgoing:
    """A job bigger than its queue's whole limit would wait forever: it fails now, saying why."""
    assert job.spec is not None
    failed = JobFailed(
        job_id=job.job_id,
        code="exceeds_queue_limit",
        reason=f"needs {job.gpus} GPUs but queue {job.spec.queue} may hold at most {limit}",
    )
    envelope = _envelope(failed, cause, "failed-quota", now)
    state.fold(envelope)
    return (state.topics.events, envelope)


def _pending(state: QuotaState, job: QuotaJob, cause: str, now: datetime) -> Outgoing:
    assert job.spec is not None
    queue = job.spec.queue
    used = state.usage.get(QueueName(queue), 0)
    limit = state.limit(queue)
    reason = PendingReason(
        code="quota",
        constraint="queue-limit",
        message=f"queue {queue} holds {used} of its {limit} GPUs; this job needs {job.gpus} more",
        details={"queue_used": used, "queue_limit": limit or 0, "needed_gpus": job.gpus},
        unblock=f"wait until {job.gpus - ((limit or 0) - used)} GPUs of queue {queue} are released",
    )
    return (
        state.topics.events,
        _envelope(JobPending(job_id=job.job_id, reasons=(reason,)), cause, "pending", now),
    )


def _envelope(event: Event, cause: str, kind: str, now: datetime) -> Envelope:
    return make_envelope(event, event_id=derived_id(cause, kind, event.subject()), source=SOURCE, time=now)
