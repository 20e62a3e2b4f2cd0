"""Elastic grow/shrink applied by the core's simulator, one rule each: trace jobs in, grants out.

The fair profile's ``elastic`` action decides a `Resize`; the simulator (`gangline.sim.gated`) applies
it (`gangline.core.resize.apply_resize`): the job's allocation is replaced by one at its new size, a
grant that names the allocation it replaces. Cluster: one node of 4 GPUs unless a test says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from scenarios.dsl import gpus

from gangline.core.actions.queueing import PreemptionPolicy
from gangline.core.model import JobId, QueueName
from gangline.core.queue_profile import fair_profile
from gangline.sim.gated import GatedPolicy, Grant
from gangline.sim.simulator import Simulator
from gangline.sim.trace import TraceJob


def trace_job(
    job_id: str,
    at: float,
    run_s: float,
    workers: int = 1,
    *,
    min_workers: int | None = None,
    priority: int = 0,
) -> TraceJob:
    return TraceJob(
        JobId(job_id), at, run_s, QueueName("q"), workers, priority=priority, min_workers=min_workers
    )


def simulate(
    jobs: Sequence[TraceJob], *, gpus_per_node: int = 4, policy: PreemptionPolicy | None = None
) -> list[Grant]:
    nodes = [gpus(gpus_per_node).build("n0")]
    gated = GatedPolicy("fair", fair_profile(), nodes, preemption=policy or PreemptionPolicy())
    Simulator(jobs, gated, float(gpus_per_node)).run()
    return gated.granted


def sizes(grants: Sequence[Grant], job: str) -> list[tuple[float, int]]:
    """(time, workers) of each of the job's grants, in order."""
    return [(g.at, len(g.allocation.placements)) for g in grants if g.allocation.job_id == job]


def test_an_elastic_job_grows_into_idle_gpus() -> None:
    blocker = trace_job("blocker", 0, 100, workers=3)
    elastic = trace_job("el", 1, 1000, workers=4, min_workers=1)
    grants = simulate([blocker, elastic])
    # Placed on the one free GPU, grown to 4 when the blocker ends at t=100.
    assert sizes(grants, "el") == [(1, 1), (100, 4)]
    grown = [g for g in grants if g.allocation.job_id == "el"][1]
    assert grown.resizes == "el.c2"


def test_an_elastic_job_is_shrunk_to_admit_a_gang() -> None:
    elastic = trace_job("el", 0, 1000, workers=4, min_workers=1)
    gang = trace_job("gang", 50, 100, workers=2, priority=5)
    grants = simulate([elastic, gang])
    assert sizes(grants, "el")[:2] == [(0, 4), (50, 2)]  # it gives up the 2 GPUs the gang needs
    assert sizes(grants, "gang") == [(50, 2)]
    el_gpus = {gpu for p in grants[1].allocation.placements for gpu in p.gpus}
    gang_gpus = {gpu for p in grants[2].allocation.placements for gpu in p.gpus}
    assert grants[1].resizes is not None and not el_gpus & gang_gpus  # no GPU held twice
    # Grown back once the gang is done.
    assert sizes(grants, "el")[2:] == [(150, 4)]


def test_a_shrink_gives_up_only_what_the_waiting_job_needs() -> None:
    elastic = trace_job("el", 0, 1000, workers=4, min_workers=1)
    one = trace_job("one", 50, 100, workers=1, priority=5)
    grants = simulate([elastic, one])
    # One rank dropped, not three (then no GPU is left idle to grow into at once).
    assert sizes(grants, "el") == [(0, 4), (50, 3), (150, 4)]
    assert sizes(grants, "one") == [(50, 1)]
    # Two elastic jobs on 8 GPUs, a 3-GPU job waiting: it takes 3 ranks in all, the jobs keep 5.
    a = trace_job("a", 0, 1000, workers=4, min_workers=1)
    b = trace_job("b", 0, 1000, workers=4, min_workers=1)
    three = trace_job("three", 50, 100, workers=3, priority=5)
    grants = simulate([a, b, three], gpus_per_node=8)
    at_50 = [len(g.allocation.placements) for g in grants if g.at == 50 and g.resizes is not None]
    assert sum(4 - n for n in at_50) == 3 and sizes(grants, "three") == [(50, 3)]


def test_an_elastic_job_is_never_shrunk_below_its_fewest_workers() -> None:
    elastic = trace_job("el", 0, 1000, workers=4, min_workers=2)
    gang = trace_job("gang", 50, 100, workers=3, priority=5)  # would need el at 1 worker
    grants = simulate([elastic, gang])
    assert sizes(grants, "el") == [(0, 4)]
    assert sizes(grants, "gang") == [(1000, 3)]
    small = trace_job("small", 50, 100, workers=2, priority=5)
    grants = simulate([elastic, small])
    assert sizes(grants, "el")[:2] == [(0, 4), (50, 2)]


def test_an_elastic_job_that_ran_less_than_the_minimum_runtime_is_not_shrunk() -> None:
    elastic = trace_job("el", 0, 1000, workers=4, min_workers=1)
    gang = trace_job("gang", 50, 100, workers=2, priority=5)
    grants = simulate([elastic, gang], policy=PreemptionPolicy(min_runtime_s=300))
    assert sizes(grants, "el") == [(0, 4)]
    assert sizes(grants, "gang") == [(1000, 2)]
    late = trace_job("gang", 400, 100, workers=2, priority=5)
    grants = simulate([elastic, late], policy=PreemptionPolicy(min_runtime_s=300))
    assert sizes(grants, "el")[:2] == [(0, 4), (400, 2)]


def test_a_job_of_higher_priority_is_not_shrunk_for_a_lower_one() -> None:
    elastic = trace_job("el", 0, 1000, workers=4, min_workers=1, priority=5)
    other = trace_job("other", 50, 100, workers=2)
    grants = simulate([elastic, other])
    assert sizes(grants, "el") == [(0, 4)]
    assert sizes(grants, "other") == [(1000, 2)]
