"""Profiles in `gangline simulate` run as the services decide (`gangline.sim.gated`): the quota gate
charges a job when it lets it through, placed or not, so a job let through that cannot be placed yet
holds its queue's quota and the queue's later jobs wait for it (docs/charge-point.md)."""

from __future__ import annotations

from pathlib import Path

from gangline.cluster_spec import load_cluster_spec
from gangline.core.defaults import default_profile
from gangline.core.model import JobId, QueueName
from gangline.queues_file import QueuesFile, queues_of
from gangline.sim.gated import GatedPolicy
from gangline.sim.simulator import Simulator
from gangline.sim.trace import TraceJob

HERE = Path(__file__).parent
QUEUES = QueuesFile.model_validate(
    {"queues": [{"name": "ops", "unlimited": True}, {"name": "team", "quotas": {"A100": {"nominal": 16}}}]}
)


def starts(quotas: bool) -> dict[str, float | None]:
    """2 nodes x 8 GPUs. ops (unlimited) runs 8 GPUs for 100 s from 0; team's 2 x 8 gang arrives at 1
    (its quota admits it, one node is busy), team's 1-GPU job of 10 s at 2."""
    jobs = [
        TraceJob(JobId("ops"), 0.0, 100.0, QueueName("ops"), 1, 8),
        TraceJob(JobId("gang"), 1.0, 50.0, QueueName("team"), 2, 8),
        TraceJob(JobId("small"), 2.0, 10.0, QueueName("team"), 1, 1),
    ]
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    policy = GatedPolicy(
        "default", default_profile(), spec.build_nodes(), queues_of(QUEUES) if quotas else None
    )
    result = Simulator(jobs, policy, float(spec.total_gpus)).run()
    return {j.id: j.start for j in result.jobs}


def test_a_charged_gang_that_waits_for_gpus_holds_its_queues_quota() -> None:
    # The gang is charged all 16 of team's quota at 1 and placed at 100; the small job is held by quota
    # (16 of 16 charged) although 8 GPUs are free, and goes through when the gang's release lowers usage.
    assert starts(quotas=True) == {"ops": 0.0, "gang": 100.0, "small": 150.0}


def test_without_quotas_the_small_job_is_backfilled_beside_the_reservation() -> None:
    # Nothing is charged: the gang holds a reservation from 100, the small job ends before it and runs.
    assert starts(quotas=False) == {"ops": 0.0, "gang": 100.0, "small": 2.0}


def test_each_jobs_flavours_are_its_shapes_found_afresh() -> None:
    """The flavours the gate reads, kept per waiting job, are those a fresh policy finds for it."""
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    shapes = [(1, 1), (1, 8), (2, 8), (1, 4), (3, 8)]
    jobs = [
        TraceJob(
            JobId(f"j{k}"), float(k), 30.0, QueueName("team" if k % 3 else "ops"), *shapes[k % len(shapes)]
        )
        for k in range(30)
    ]
    kept = GatedPolicy("default", default_profile(), spec.build_nodes(), queues_of(QUEUES))
    Simulator(jobs, kept, float(spec.total_gpus)).run()
    # j1 again with another shape (checked first: the check itself keeps what it asks for): a job id
    # seen before, once it has run, is looked up afresh.
    again = TraceJob(JobId("j1"), 0.0, 1.0, QueueName("team"), 3, 8)
    for trace_job in [again, *(j for j in jobs if j.id != again.id)]:
        if not kept.limits(trace_job.queue):
            continue  # the gate asks only for the jobs of queues it limits
        job = trace_job.to_job()
        fresh = GatedPolicy("default", default_profile(), spec.build_nodes(), queues_of(QUEUES))
        assert kept._flavours(job) == fresh._flavours(job)
