"""The ledger's folds: a job's row from its history in any order, a node's row event by event."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import Event
from services.ledger.projections import (
    NodeRow,
    StoredEvent,
    apply_node_event,
    fold_job,
    newer_status,
    queue_status_row,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
JOB = "job-7"


def at(seconds: int, data: Event, event_id: str | None = None) -> StoredEvent:
    return StoredEvent(event_id or f"e{seconds}", T0 + timedelta(seconds=seconds), data)


def requested(**extra: object) -> jobs.JobRequested:
    return jobs.JobRequested.model_validate(
        {"job_id": JOB, "queue": "research", "workers": 2, "gpus_per_worker": 4, **extra}
    )


def pending(message: str, code: str = "gang_size") -> jobs.JobPending:
    reason = jobs.PendingReason(code=code, constraint="gang", message=message, unblock="free 8 GPUs")
    return jobs.JobPending(job_id=JOB, reasons=(reason,))


def granted() -> allocations.AllocationGranted:
    return allocations.AllocationGranted(
        job_id=JOB,
        allocation_id="a1",
        queue="research",
        placements=(
            allocations.Placement(rank=0, node="n0", gpus=("gpu0", "gpu1", "gpu2", "gpu3")),
            allocations.Placement(rank=1, node="n1", gpus=("gpu0", "gpu1", "gpu2", "gpu3")),
        ),
    )


LIFE = [
    at(0, requested(priority=5, submitted_by="alice")),
    at(1, jobs.JobAdmitted(job_id=JOB, spec=requested(priority=5).spec())),
    at(2, jobs.JobQueued(job_id=JOB, queue="research")),
    at(3, pending("needs 8 GPUs in one NVLink domain; largest free is 6")),
    at(4, jobs.JobPlaced(job_id=JOB, allocation_id="a1", nodes=("n0", "n1"))),
    at(5, granted()),
    at(6, jobs.JobStarted(job_id=JOB, allocation_id="a1")),
]


def test_the_lifecycle_folds_to_a_running_job_with_its_request_fields() -> None:
    row = fold_job(JOB, LIFE)
    assert row is not None
    assert (row.state, row.queue, row.priority, row.workers, row.gpus_per_worker) == (
        "running",
        "research",
        5,
        2,
        4,
    )
    assert row.submitted_by == "alice"
    assert row.submitted_at == T0 and row.admitted_at == T0 + timedelta(seconds=1)
    assert row.started_at == T0 + timedelta(seconds=6)
    assert row.allocation_id == "a1" and row.last_event_id == "e6"
    assert row.reason is None and row.pending_reasons == ()


def test_the_row_does_not_depend_on_the_order_the_topics_were_read_in() -> None:
    expected = fold_job(JOB, LIFE)
    for order in itertools.islice(itertools.permutations(LIFE), 0, 5040, 97):
        assert fold_job(JOB, order) == expected


def test_a_pending_job_carries_every_reason_and_the_first_as_its_reason() -> None:
    row = fold_job(JOB, LIFE[:4])
    assert row is not None
    assert row.state == "pending"
    assert row.reason == "needs 8 GPUs in one NVLink domain; largest free is 6"
    assert row.reason_code == "gang_size"
    assert row.pending_reasons[0]["unblock"] == "free 8 GPUs"


def test_no_row_until_the_spec_is_known() -> None:
    assert fold_job(JOB, [at(3, pending("waiting"))]) is None
    row = fold_job(
        JOB, [at(3, pending("waiting")), at(1, jobs.JobAdmitted(job_id=JOB, spec=requested().spec()))]
    )
    assert row is not None and row.state == "pending"


@pytest.mark.parametrize(
    ("final", "state"),
    [
        (jobs.JobCompleted(job_id=JOB, allocation_id="a1"), "completed"),
        (jobs.JobFailed(job_id=JOB, code="worker_exit", reason="rank 1 exited 3"), "failed"),
        (jobs.JobFailed(job_id=JOB, code="cancelled", reason="cancelled by alice"), "cancelled"),
        (allocations.AllocationReleased(job_id=JOB, allocation_id="a1", reason="cancelled"), "cancelled"),
    ],
)
def test_a_finished_job_stays_finished(final: Event, state: str) -> None:
    late = at(20, pending("a late word from a slow cycle"))
    row = fold_job(JOB, [*LIFE, at(10, final), late])
    assert row is not None
    assert row.state == state
    assert row.finished_at == T0 + timedelta(seconds=10)


def test_a_requeued_job_counts_its_attempt_and_runs_again() -> None:
    history = [
        *LIFE,
        at(7, jobs.JobPreempting(job_id=JOB, allocation_id="a1", deadline=T0, reason="urgent job u1")),
        at(8, jobs.JobPreempted(job_id=JOB, allocation_id="a1", checkpointed=True)),
        at(9, jobs.JobRequeued(job_id=JOB, reason="preempted", attempt=2, resume_from="s3://ck/7")),
    ]
    row = fold_job(JOB, history)
    assert row is not None and (row.state, row.attempt, row.reason_code) == ("requeued", 2, "preempted")
    row = fold_job(JOB, [*history, at(12, jobs.JobStarted(job_id=JOB, allocation_id="a2", attempt=2))])
    assert row is not None and (row.state, row.allocation_id) == ("running", "a2")


def test_a_rejection_keeps_its_reason_and_a_cancel_request_is_remembered() -> None:
    rejected = jobs.JobRejected(job_id=JOB, code="unknown_queue", reason="queue 'research' does not exist")
    row = fold_job(JOB, [LIFE[0], at(1, rejected), at(2, jobs.JobCancelRequested(job_id=JOB))])
    assert row is not None
    assert (row.state, row.reason_code) == ("rejected", "unknown_queue")
    assert row.cancel_requested_at == T0 + timedelta(seconds=2)


def gpu(i: int) -> nodes.GpuInfo:
    return nodes.GpuInfo(id=f"gpu{i}", index=i, uuid=f"GPU-{i}", model="H100", memory_mib=81920)


def registered() -> nodes.NodeRegistered:
    return nodes.NodeRegistered(
        node="n0", address="10.0.0.1", gpus=(gpu(0), gpu(1)), nvlink_domain="n0", leaf="l0", spine="s0"
    )


def fold_node(*events: StoredEvent) -> NodeRow:
    row: NodeRow | None = None
    for event in events:
        row = apply_node_event(row, "n0", event)
    assert row is not None
    return row


def test_a_registered_node_is_ready_with_its_gpus_and_topology() -> None:
    row = fold_node(at(0, registered()), at(5, nodes.NodeHeartbeat(node="n0", seq=3)))
    assert (row.state, row.gpu_count, row.gpu_model, row.leaf) == ("ready", 2, "H100", "l0")
    assert row.last_heartbeat_at == T0 + timedelta(seconds=5) and row.last_seq == 3


def test_a_heartbeat_read_before_the_registration_leaves_an_unregistered_node_until_it_arrives() -> None:
    beat = at(5, nodes.NodeHeartbeat(node="n0", seq=1))
    assert fold_node(beat).state == "unregistered"
    row = fold_node(beat, at(0, registered()))
    assert row.state == "ready" and row.last_heartbeat_at == T0 + timedelta(seconds=5)


def test_a_failed_gpu_is_cordoned_until_it_recovers() -> None:
    def health(seconds: int, state: nodes.HealthState, kind: str) -> StoredEvent:
        cause = nodes.HealthCause.model_validate(
            {"kind": kind, "message": "XID 79: fell off the bus", "xid": 79}
        )
        return at(
            seconds,
            nodes.GpuHealthChanged(node="n0", gpu="gpu1", previous="healthy", state=state, cause=cause),
        )

    row = fold_node(at(0, registered()), health(1, "failed", "xid"))
    assert (row.state, row.cordoned_gpus) == ("unhealthy", ["gpu1"])
    assert row.health_reason == "gpu1: XID 79: fell off the bus"
    row = fold_node(at(0, registered()), health(1, "failed", "xid"), health(2, "healthy", "recovered"))
    assert (row.state, row.cordoned_gpus) == ("ready", [])


def test_a_lost_node_stays_lost_until_it_registers_again_and_old_news_changes_nothing() -> None:
    failed = at(10, nodes.NodeFailed(node="n0", code="heartbeat_timeout", reason="no heartbeat for 30 s"))
    row = fold_node(at(0, registered()), failed)
    assert (row.state, row.health_reason) == ("lost", "no heartbeat for 30 s")
    assert fold_node(at(0, registered()), failed, at(5, registered())).state == "lost"
    assert fold_node(at(0, registered()), failed, at(20, registered())).state == "ready"


def test_a_queue_status_row_is_quotas_figure_copied_and_the_latest_as_of_wins() -> None:
    def status(as_of: int, share: float) -> queues.QueueStatus:
        return queues.QueueStatus(
            queue="research",
            cohort="lab",
            weight=2.0,
            dominant_share=share,
            dominant_resource="H100",
            position=2,
            of=3,
            resources={"H100": queues.QueueResource(used=12, nominal=8, borrowed=4, lendable=0)},
            as_of=T0 + timedelta(seconds=as_of),
        )

    row = queue_status_row(at(30, status(20, 0.375), "s1"))
    assert row is not None
    assert (row.queue, row.cohort, row.weight, row.dominant_share, row.position, row.ranked_among) == (
        "research",
        "lab",
        2.0,
        0.375,
        2,
        3,
    )
    assert row.resources == {"H100": {"used": 12, "nominal": 8, "borrowed": 4, "lendable": 0}}
    assert (row.as_of, row.updated_at, row.event_id) == (
        T0 + timedelta(seconds=20),
        T0 + timedelta(seconds=30),
        "s1",
    )
    older = queue_status_row(at(40, status(10, 0.5), "s0"))
    assert older is not None
    assert newer_status(None, row) and not newer_status(row, older) and newer_status(older, row)
    assert queue_status_row(at(1, requested())) is None


# -- accounting (migration 0004) -----------------------------------------------------------------


def granted_as(allocation_id: str, gpu_type: str | None = None) -> allocations.AllocationGranted:
    return granted().model_copy(update={"allocation_id": allocation_id, "gpu_type": gpu_type})


def test_a_job_is_charged_its_held_time_times_its_gpus_for_each_attempt() -> None:
    history = [
        *LIFE,  # granted a1 (8 GPUs) at 5 s
        at(605, allocations.AllocationReleased(job_id=JOB, allocation_id="a1", reason="preempted")),
        at(606, jobs.JobRequeued(job_id=JOB, reason="preempted", attempt=2)),
        at(700, granted_as("a2", "H100")),
        # The agent's own figure, when the release carries one, is the charge.
        at(
            900,
            allocations.AllocationReleased(
                job_id=JOB, allocation_id="a2", reason="completed", gpu_seconds=1234
            ),
        ),
        at(900, jobs.JobCompleted(job_id=JOB, allocation_id="a2")),
    ]
    row = fold_job(JOB, history)
    assert row is not None
    granted_gpus = granted().gpu_share
    assert row.gpu_seconds == pytest.approx(granted_gpus * 600 + 1234)
    assert row.granted_at == T0 + timedelta(seconds=5)  # the first grant
    assert (row.gpu_model, row.final_state, row.state) == ("H100", "completed", "completed")
    assert fold_job(JOB, [*history, history[-3]]) == row  # a release read twice is charged once
    for order in itertools.islice(itertools.permutations(history), 0, 40320, 997):
        assert fold_job(JOB, order) == row


def test_the_gpu_model_is_the_grants_else_the_charged_one_else_the_jobs_own() -> None:
    own = requested(gpu_type="A100")
    base = [at(0, own), at(1, jobs.JobAdmitted(job_id=JOB, spec=own.spec()))]
    row = fold_job(JOB, base)
    assert row is not None and row.gpu_model == "A100"
    charged = [*base, at(2, jobs.JobQueued(job_id=JOB, queue="research", gpu_type="L40S"))]
    row = fold_job(JOB, charged)
    assert row is not None and row.gpu_model == "L40S"
    row = fold_job(JOB, [*charged, at(3, granted_as("a1", "H100"))])
    assert row is not None and row.gpu_model == "H100"


def test_a_live_job_has_no_final_state_and_no_charge_before_its_release() -> None:
    row = fold_job(JOB, LIFE)
    assert row is not None
    assert (row.final_state, row.gpu_seconds) == (None, 0.0)


def test_an_elastic_resize_counts_each_size_for_its_time_and_is_one_run() -> None:
    """Granted 2 workers x 4 GPUs at t=5, resized to 1 worker at t=65 (release resized, the grant naming
    it), completed at t=125: 8 GPUs x 60 s + 4 GPUs x 60 s, one attempt, resizing while asked."""
    small = allocations.AllocationGranted(
        job_id=JOB, allocation_id="a2", queue="research", placements=granted().placements[:1], resizes="a1"
    )
    resizing = jobs.JobResizing(
        job_id=JOB,
        allocation_id="a1",
        from_workers=2,
        to_workers=1,
        placements=small.placements,
        deadline=T0 + timedelta(seconds=90),
        reason="job urgent needs the GPUs (elastic job-7 shrinks to 1 worker(s) for waiting urgent)",
    )
    asked = fold_job(JOB, [*LIFE, at(60, resizing)])
    assert asked is not None and (asked.state, asked.reason_code) == ("resizing", "resizing")
    history = [
        *LIFE,
        at(60, resizing),
        at(65, allocations.AllocationReleased(job_id=JOB, allocation_id="a1", reason="resized")),
        at(65, small, "e65-grant"),
        at(66, jobs.JobStarted(job_id=JOB, allocation_id="a2")),
        at(125, jobs.JobCompleted(job_id=JOB, allocation_id="a2")),
        at(125, allocations.AllocationReleased(job_id=JOB, allocation_id="a2", reason="completed"), "e125-r"),
    ]
    for order in (history, history[::-1]):
        row = fold_job(JOB, order)
        assert row is not None
        assert row.state == "completed" and row.attempt == 1
        assert row.gpu_seconds == pytest.approx(8 * 60 + 4 * 60)
