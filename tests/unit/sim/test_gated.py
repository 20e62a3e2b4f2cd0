"""Profiles in `gangline simulate` run as the services decide (`gangline.sim.gated`): the quota gate
charges a job when it lets it through, placed or not, so a job let through that cannot be placed yet
holds its queue's quota and the queue's later jobs wait for it (docs/charge-point.md)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from gangline.cluster_spec import load_cluster_spec
from gangline.core.defaults import DEFAULT_PROFILE_YAML, default_profile, placement_registry
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.model import JobId, QueueName
from gangline.queues_file import QueuesFile, queues_of
from gangline.sim.gated import GatedPolicy
from gangline.sim.simulator import Simulator
from gangline.sim.trace import TraceJob

HERE = Path(__file__).parent
QUEUES = QueuesFile.model_validate(
    {"queues": [{"name": "ops", "unlimited": True}, {"name": "team", "quotas": {"A100": {"nominal": 16}}}]}
)


def starts(quotas: bool, profile: Profile | None = None) -> dict[str, float | None]:
    """2 nodes x 8 GPUs. ops (unlimited) runs 8 GPUs for 100 s from 0; team's 2 x 8 gang arrives at 1
    (its quota admits it, one node is busy), team's 1-GPU job of 10 s at 2."""
    jobs = [
        TraceJob(JobId("ops"), 0.0, 100.0, QueueName("ops"), 1, 8),
        TraceJob(JobId("gang"), 1.0, 50.0, QueueName("team"), 2, 8),
        TraceJob(JobId("small"), 2.0, 10.0, QueueName("team"), 1, 1),
    ]
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    policy = GatedPolicy(
        "default", profile or default_profile(), spec.build_nodes(), queues_of(QUEUES) if quotas else None
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


def with_settings(**settings: float) -> Profile:
    profile = default_profile()
    return replace(profile, settings=replace(profile.settings, **settings))


def test_the_gate_lends_the_unplaced_gangs_charge_to_a_short_job() -> None:
    # gate_credit_s: the gang's 16 charged GPUs stand for none running, so the 10-s job goes through on
    # that credit and placement backfills it beside the gang's reservation (it ends before 100).
    assert starts(quotas=True, profile=with_settings(gate_credit_s=3600.0)) == {
        "ops": 0.0,
        "gang": 100.0,
        "small": 2.0,
    }
    # A window shorter than the job: no credit, the quota gate holds it as before.
    assert starts(quotas=True, profile=with_settings(gate_credit_s=5.0))["small"] == 150.0


def reserving(horizon_s: float | None) -> Profile:
    horizon = f", horizon_s: {horizon_s}" if horizon_s is not None else ""
    args = "{max_reservations: 1, min_gpus: 2" + horizon + "}"
    text = re.sub(r"\{max_reservations: 1, min_gpus: 2[^}]*\}", args, DEFAULT_PROFILE_YAML)
    assert args in text
    return load_profile(text, placement_registry())


def horizon_starts(horizon_s: float | None) -> dict[str, float | None]:
    """No quotas. ops holds one node until 100; the 2 x 8 gang arrives at 1 (earliest start 100); a 1-GPU
    job of 200 s at 2, too long to end before the gang's start."""
    jobs = [
        TraceJob(JobId("ops"), 0.0, 100.0, QueueName("ops"), 1, 8),
        TraceJob(JobId("gang"), 1.0, 50.0, QueueName("team"), 2, 8),
        TraceJob(JobId("long"), 2.0, 200.0, QueueName("team"), 1, 1),
    ]
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    policy = GatedPolicy("default", reserving(horizon_s), spec.build_nodes(), None)
    result = Simulator(jobs, policy, float(spec.total_gpus)).run()
    return {j.id: j.start for j in result.jobs}


def test_a_reservation_further_off_than_the_horizon_holds_no_gpus_yet() -> None:
    # Without a horizon the idle node is held for the gang from 1 to 100 and the long job waits for the
    # gang to end; with a 50-s horizon (the start is 99 s away) nothing is held, the long job runs at once
    # and the gang starts when it ends.
    assert horizon_starts(None) == {"ops": 0.0, "gang": 100.0, "long": 150.0}
    assert horizon_starts(50.0) == {"ops": 0.0, "gang": 202.0, "long": 2.0}
