"""Reclaims in the figures: a job stopped because its cohort took back quota it borrowed is counted as a
reclaim (``reclaims``), apart from priority preemptions, by both engines: the services' run reads it
from preemption's ``job.preempting`` (``preemption_reason``), the core's simulator from the eviction
the core's ``reclaim`` action made."""

from __future__ import annotations

from pathlib import Path

from gangline.cluster_spec import load_cluster_spec
from gangline.core.defaults import placement_registry, profile_path
from gangline.core.framework.profile import load_profile_file
from gangline.core.model import JobId, QueueName
from gangline.queues_file import load_queues_file
from gangline.sim.metrics import summarize
from gangline.sim.policies import CorePolicy
from gangline.sim.run import queue_setup
from gangline.sim.simulator import Simulator
from gangline.sim.trace import TraceJob
from services.tools.simulate.trace_run import simulate_services

SIM = Path(__file__).parents[1] / "sim"
A, B = QueueName("team-a"), QueueName("team-b")


def jobs() -> list[TraceJob]:
    """team-b borrows team-a's idle quota with two preemptible 8-GPU jobs; then team-a asks for its own."""
    return [
        TraceJob(JobId("b-1"), 0.0, 20_000.0, B, 1, 8, preemptible=True),
        TraceJob(JobId("b-2"), 1.0, 20_000.0, B, 1, 8, preemptible=True),
        TraceJob(JobId("a-1"), 3_600.0, 600.0, A, 1, 8),
    ]


def test_the_services_count_the_borrowers_job_they_stop_as_a_reclaim() -> None:
    spec = load_cluster_spec(SIM / "tiny_cluster.yaml")
    run = simulate_services(jobs(), spec, queues=SIM / "tiny_queues.yaml").result
    by_id = {j.id: j for j in run.jobs}
    assert by_id[JobId("b-2")].preemptions == 1
    assert by_id[JobId("b-2")].reclaims == 1
    figures = summarize(run)
    assert figures["reclaims"] == 1 and figures["preemptions"] == 1
    assert figures["per_queue"][B]["reclaims"] == 1 and figures["per_queue"][A]["reclaims"] == 0


def test_the_core_simulator_counts_a_reclaim_as_the_services_do() -> None:
    spec = load_cluster_spec(SIM / "tiny_cluster.yaml")
    nodes = spec.build_nodes()
    queues = load_queues_file(SIM / "tiny_queues.yaml")
    fair = load_profile_file(profile_path().parent / "fair.yaml", placement_registry())
    policy = CorePolicy("fair", fair, nodes, queue_setup(queues, spec, nodes, jobs()))
    run = Simulator(jobs(), policy, float(spec.total_gpus)).run()
    figures = summarize(run)
    assert figures["preemptions"] == 1 and figures["reclaims"] == 1
    assert figures["per_queue"][B]["reclaims"] == 1
