"""One realistic example of every registered event version: the golden files in schemas/examples/.

Ids and times are fixed so the files are byte-for-byte reproducible. Tests elsewhere may reuse them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import Envelope, Event, make_envelope

EPOCH = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

_SOURCES = {
    "job.requested": "gangline/api",
    "job.cancel_requested": "gangline/api",
    "job.admitted": "gangline/admission",
    "job.rejected": "gangline/admission",
    "job.queued": "gangline/quota",
    "job.pending": "gangline/placement",
    "job.placed": "gangline/placement",
    "allocation.granted": "gangline/placement",
    "job.preempting": "gangline/preemption",
    "job.resizing": "gangline/preemption",
    "job.preempted": "gangline/preemption",
    "job.requeued": "gangline/preemption",
    "allocation.released": "gangline/preemption",
    "node.failed": "gangline/node_health",
    "node.rejected": "gangline/placement",
    "queue.status": "gangline/quota",
    "node.cordoned": "gangline/api",
    "node.uncordoned": "gangline/api",
}


def example_events() -> list[Event]:
    """The payloads, in the order a job's life and a node's life would produce them."""
    request = jobs.JobRequested(
        job_id="llama-ft-0042",
        queue="team-nlp",
        workers=2,
        gpus_per_worker=8,
        priority=100,
        gpu_type="H100-SXM5-80GB",
        gpu_memory_mib=81_559,
        topology=jobs.Topology(level="leaf", mode="preferred"),
        preemptible=True,
        checkpoint_grace_s=120,
        command=("torchrun", "train.py", "--config", "llama-8b.yaml"),
        env={"NCCL_DEBUG": "WARN"},
        duration_hint_s=14_400,
        submitted_by="alice@nlp",
    )
    placements = (
        allocations.Placement(rank=0, node="dgx-a01", gpus=tuple(f"gpu{i}" for i in range(8))),
        allocations.Placement(rank=1, node="dgx-a02", gpus=tuple(f"gpu{i}" for i in range(8))),
    )
    job = request.job_id
    alloc = "llama-ft-0042.a1"
    return [
        request,
        jobs.JobCancelRequested(job_id=job, reason="Superseded by run 0043.", requested_by="alice@nlp"),
        jobs.JobAdmitted(job_id=job, spec=request.spec()),
        jobs.JobRejected(
            job_id="sweep-17",
            code="unknown_queue",
            reason="Queue 'team-vision' does not exist; ask an admin to create it or use another queue.",
        ),
        jobs.JobQueued(job_id=job, queue="team-nlp"),
        jobs.JobPending(
            job_id=job,
            cycle=311,
            reasons=(
                jobs.PendingReason(
                    code="fragmentation",
                    constraint="gang",
                    message="needs 2 nodes with 8 free H100 GPUs each; 16 are free but spread over 5 nodes",
                    details={"needed_gpus": 16, "free_gpus": 16, "nodes_with_8_free": 1},
                    unblock="wait for job resnet-7 (ends in ~20 min) or allow fewer GPUs per worker",
                ),
            ),
        ),
        jobs.JobPlaced(
            job_id=job,
            allocation_id=alloc,
            nodes=("dgx-a01", "dgx-a02"),
            cycle=312,
            score=87,
            reasons=(
                jobs.DecisionReason(plugin="topology", message="both ranks under leaf leaf-a", score=100),
                jobs.DecisionReason(
                    plugin="binpack", message="fills two empty nodes; no domain split", score=74
                ),
            ),
        ),
        allocations.AllocationGranted(
            job_id=job,
            allocation_id=alloc,
            queue="team-nlp",
            gpu_type="H100-SXM5-80GB",
            placements=placements,
        ),
        jobs.JobStarted(job_id=job, allocation_id=alloc, attempt=1),
        jobs.JobPreempting(
            job_id=job,
            allocation_id=alloc,
            deadline=EPOCH + timedelta(hours=2, minutes=2),
            reason="queue team-speech reclaims its nominal quota for priority 500 work",
            preemptor_job_id="asr-urgent-3",
        ),
        jobs.JobCheckpointed(
            job_id=job,
            allocation_id=alloc,
            node="dgx-a01",
            checkpoint="s3://ckpt/llama-ft-0042/step-12000",
            step=12_000,
        ),
        jobs.JobPreempted(job_id=job, allocation_id=alloc, checkpointed=True, lost_gpu_seconds=960),
        allocations.AllocationReleased(
            job_id=job, allocation_id=alloc, reason="preempted", gpu_seconds=115_200
        ),
        jobs.JobRequeued(
            job_id=job, reason="preempted", attempt=2, resume_from="s3://ckpt/llama-ft-0042/step-12000"
        ),
        jobs.WorkerExited(
            job_id=job,
            allocation_id="llama-ft-0042.a2",
            rank=1,
            node="dgx-a03",
            exit_code=0,
            gpus=("gpu0", "gpu1"),
        ),
        jobs.JobCompleted(job_id=job, allocation_id="llama-ft-0042.a2", gpu_seconds=230_400),
        jobs.JobFailed(
            job_id="sweep-12",
            allocation_id="sweep-12.a1",
            code="restarts_exhausted",
            reason="rank 3 exited with code 1 four times; the restart limit is 3",
            exit_code=1,
            gpu_seconds=3_840,
        ),
        nodes.NodeRegistered(
            node="dgx-a01",
            address="10.0.1.11",
            gpus=tuple(
                nodes.GpuInfo(
                    id=f"gpu{i}",
                    index=i,
                    uuid=f"GPU-8c3a1f2e-0000-4000-8000-00000000000{i}",
                    model="H100-SXM5-80GB",
                    memory_mib=81_559,
                    nvlink_peers=tuple(f"gpu{p}" for p in range(4) if p != i),
                )
                for i in range(4)
            ),
            nvlink_domain="dgx-a01",
            leaf="leaf-a",
            spine="spine-1",
            labels={"zone": "dc1-hall2"},
            agent_version="0.1.0",
        ),
        nodes.NodeHeartbeatV1(
            node="dgx-a01",
            seq=41,
            gpus_healthy=("gpu0", "gpu1", "gpu2"),
            gpus_unhealthy=("gpu3",),
            gpus_busy=("gpu0",),
        ),
        nodes.NodeHeartbeat(
            node="dgx-a01",
            seq=42,
            gpus=(
                nodes.GpuStatus(
                    id="gpu0",
                    healthy=True,
                    busy=True,
                    utilization_pct=97,
                    memory_used_mib=71_024,
                    temperature_c=64,
                ),
                nodes.GpuStatus(id="gpu1", healthy=True, busy=False, utilization_pct=0, memory_used_mib=0),
            ),
        ),
        nodes.GpuHealthChanged(
            node="dgx-a01",
            gpu="gpu3",
            previous="healthy",
            state="failed",
            cause=nodes.HealthCause(kind="xid", xid=79, message="XID 79: GPU has fallen off the bus"),
        ),
        nodes.NodeFailed(
            node="dgx-b07",
            code="heartbeat_timeout",
            reason="no heartbeat for 30 s (last seq 9120)",
            last_seq=9120,
        ),
        nodes.GpuErrorReported(
            node="dgx-a01",
            gpu="gpu5",
            state="healthy",
            cause=nodes.HealthCause(kind="xid", xid=13, message="xid.13: graphics engine exception"),
        ),
        nodes.NodeRejected(
            node="dgx-c03",
            code="unsupported_hardware",
            reason="GPU gpu0: MIG is on, but model 'A30' has no known MIG geometry",
            registration_id="5d0c2a4e-1f6b-4c3a-9e2d-7b8a6f4e3c21",
        ),
        queues.QueueStatus(
            queue="team-nlp",
            cohort="research",
            weight=2.0,
            dominant_share=0.1875,
            dominant_resource="H100-SXM5-80GB",
            position=2,
            of=3,
            resources={
                "H100-SXM5-80GB": queues.QueueResource(used=24, nominal=16, borrowed=8, lendable=8),
                "A100-SXM4-80GB": queues.QueueResource(used=0, nominal=8, borrowed=0, lendable=16),
            },
            as_of=EPOCH + timedelta(seconds=20),
        ),
        nodes.NodeCordoned(
            node="dgx-a02",
            mode="drain",
            reason="firmware update in the 14:00 window",
            requested_by="sre-oncall",
            drain_grace_s=600,
        ),
        nodes.NodeUncordoned(node="dgx-a02", reason="firmware updated", requested_by="sre-oncall"),
        jobs.JobResizing(
            job_id="elastic-bert-7",
            allocation_id="elastic-bert-7.2",
            from_workers=2,
            to_workers=1,
            placements=placements[:1],
            deadline=EPOCH + timedelta(hours=2, minutes=2),
            reason="elastic elastic-bert-7 shrinks to 1 worker(s) for waiting asr-urgent-3",
            preemptor_job_id="asr-urgent-3",
        ),
        queues.QuotaTicked(cohort="research"),
        jobs.JobRouted(
            job_id=job,
            pool="spine-a",
            spec=request.spec(),
            admitted_at=datetime(2025, 3, 1, 9, 0, 3, tzinfo=UTC),
        ),
    ]


def example_envelopes() -> dict[str, Envelope]:
    """wire type -> an envelope of it, with ids, times and causation chained the way services set them."""
    out: dict[str, Envelope] = {}
    previous: str | None = None
    for n, data in enumerate(example_events()):
        event_id = f"0195522c-{n:04x}-7000-8000-00000000{n:04x}"
        source = _SOURCES.get(data.TYPE, f"gangline/agent/{data.subject()}")
        about_a_job = data.TYPE.startswith(("job.", "allocation.", "worker."))
        out[data.wire_type()] = make_envelope(
            data,
            event_id=event_id,
            source=source,
            time=EPOCH + timedelta(seconds=n),
            causationid=previous if about_a_job else None,
            traceparent=TRACEPARENT if about_a_job else None,
        )
        previous = event_id
    return out
