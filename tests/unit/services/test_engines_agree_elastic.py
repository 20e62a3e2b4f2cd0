"""The two engines agree on elastic resizes: the core's simulator applies each `Resize` as its cycle
decides it; the services carry it out with the checkpoint protocol (placement's ``job.resizing`` for a
grow, preemption's for a shrink, then preemption's ``allocation.released`` ``resized`` and the grant at
the new size). With the simulated agents answering a checkpoint at once (delay 0), every grant is the
same: time, job, size and GPUs, and which grants replace an allocation.

The world (`engines/elastic-cluster.yaml`, 2 x 4 GPUs, the fair profile): a 6-GPU job holds most of
the cluster; an elastic 1..4-worker job lands on what is left, grows when the blocker ends, is shrunk
to the 2 workers a 6-worker gang of higher priority leaves it when the gang arrives, and grows back to
4 once the gang is done; a later 2-GPU job is placed beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.cluster_spec import load_cluster_spec
from gangline.core.defaults import placement_registry
from gangline.core.framework.profile import load_profile_file
from gangline.core.model import JobId, QueueName
from gangline.events.allocations import AllocationGranted
from gangline.sim.gated import GatedPolicy
from gangline.sim.simulator import Simulator
from gangline.sim.trace import TraceJob
from services.tools.simulate import simulate_services
from services.tools.simulate.engine import EPOCH, NodeOptions
from services.tools.simulate.trace_run import SimulateOptions

WORLD = Path(__file__).resolve().parent / "engines"
PROFILE = Path(__file__).resolve().parents[3] / "deploy" / "profiles" / "fair.yaml"

Grant = tuple[float, str, int, bool, tuple[str, ...]]
"""(virtual time, job, workers, whether it resizes an allocation, the GPUs as node/gpu)."""


def _jobs() -> list[TraceJob]:
    def job(name: str, at: float, run_s: float, workers: int, **kw: int) -> TraceJob:
        return TraceJob(JobId(name), at, run_s, QueueName("default"), workers, **kw)  # type: ignore[arg-type]

    return [
        job("blocker", 0, 100, 6),
        job("el", 10, 3000, 4, min_workers=1),
        job("gang", 500, 200, 6, priority=5),
        job("late", 900, 100, 2),
    ]


def _core() -> list[Grant]:
    spec = load_cluster_spec(WORLD / "elastic-cluster.yaml")
    policy = GatedPolicy("fair", load_profile_file(PROFILE, placement_registry()), spec.build_nodes())
    Simulator(_jobs(), policy, float(spec.total_gpus)).run()
    return [
        (
            round(g.at, 6),
            str(g.allocation.job_id),
            len(g.allocation.placements),
            g.resizes is not None,
            tuple(str(x) for p in g.allocation.placements for x in p.gpus),
        )
        for g in policy.granted
    ]


def _services() -> list[Grant]:
    spec = load_cluster_spec(WORLD / "elastic-cluster.yaml")
    options = SimulateOptions(nodes=NodeOptions(checkpoint_delay_s=0.0))
    run = simulate_services(_jobs(), spec, profile_path=PROFILE, options=options, keep_log=True)
    sim = run.simulation
    return [
        (
            round((e.time - EPOCH).total_seconds(), 6),
            str(e.data.job_id),
            len(e.data.placements),
            e.data.resizes is not None,
            tuple(f"{p.node}/{g}" for p in e.data.placements for g in p.gpus),
        )
        for e in sim.envelopes(sim.topics.allocations)
        if isinstance(e.data, AllocationGranted)
    ]


def test_both_engines_grow_and_shrink_the_elastic_job_alike() -> None:
    core = _core()
    assert core == _services()
    sizes = [(t, workers) for t, job, workers, _, _ in core if job == "el"]
    assert sizes == [(10, 2), (100, 4), (500, 2), (700, 4)]
    assert [resized for _, job, _, resized, _ in core if job == "el"] == [False, True, True, True]


def test_both_engines_count_the_elastic_job_as_one_run() -> None:
    """A resize is neither an end nor a start: each job finishes once, the elastic one when it is done."""
    from gangline.sim.metrics import summarize

    spec = load_cluster_spec(WORLD / "elastic-cluster.yaml")
    options = SimulateOptions(nodes=NodeOptions(checkpoint_delay_s=0.0))
    run = simulate_services(_jobs(), spec, profile_path=PROFILE, options=options)
    policy = GatedPolicy("fair", load_profile_file(PROFILE, placement_registry()), spec.build_nodes())
    core = Simulator(_jobs(), policy, float(spec.total_gpus)).run()
    for result in (run.result, core):
        figures = summarize(result)
        assert (figures["completed"], figures["unfinished"]) == (4, 0), figures
        assert min(result.series.waiting) == 0  # a resize grant is no start of a waiting job
    assert summarize(run.result)["mean_jct_s"] == summarize(core)["mean_jct_s"]


def test_both_engines_count_the_elastic_job_at_its_size_of_the_moment() -> None:
    """GPU-time follows the resizes: el holds 2 GPUs from 10 to 100, 4 to 500, 2 to 700, then 4 to its
    end at 3010; beside it the blocker (6 x 100 s), the gang (6 x 200 s), late
    (2 x 100 s). At its full 4 throughout it would count 12,000 GPU-seconds, not 11,420."""
    from gangline.sim.metrics import summarize

    spec = load_cluster_spec(WORLD / "elastic-cluster.yaml")
    options = SimulateOptions(nodes=NodeOptions(checkpoint_delay_s=0.0))
    run = simulate_services(_jobs(), spec, profile_path=PROFILE, options=options)
    policy = GatedPolicy("fair", load_profile_file(PROFILE, placement_registry()), spec.build_nodes())
    core = Simulator(_jobs(), policy, float(spec.total_gpus)).run()
    el = 2 * 90 + 4 * 400 + 2 * 200 + 4 * 2310
    busy = el + 6 * 100 + 6 * 200 + 2 * 100
    for result in (run.result, core):
        figures = summarize(result)
        assert result.busy_gpu_s == busy
        assert figures["utilization"] == pytest.approx(busy / (8 * 3010))
        assert {j.id: j.gpu_hours * 3600 for j in result.jobs}["el"] == pytest.approx(el)
        assert figures["per_queue"]["default"]["gpu_hours"] == pytest.approx(busy / 3600)  # type: ignore[index]
    assert summarize(core)["allocation"] == pytest.approx(summarize(core)["utilization"])  # held as counted
