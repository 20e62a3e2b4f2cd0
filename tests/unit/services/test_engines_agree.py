"""The two engines of `gangline simulate` decide the same grants: the core's simulator (a profile
under `gangline.sim.gated`) and the services on their in-memory bus (`--services`).

The world: 300 jobs of the Philly trace (`engines/philly-slice.csv`: from 2017-10-27, every job of 2
to 16 GPUs and one in twelve single-GPU jobs, run time 1 min to 12 h; the two busiest virtual
clusters are team-a and team-b, the rest team-c), at twice their arrival rate, on 32 GPUs
(`engines/cluster.yaml`), with three queues in one cohort (`engines/queues.yaml`: borrowing
without limit, with a borrowing limit, with a lending limit). Both engines charge quota when the
gate lets a job through (`gangline.core.charging`) and place with the same cycle
(`placement_cycle`), so every grant is the same: job, time, nodes and GPUs per rank.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from gangline.cluster_spec import load_cluster_spec
from gangline.core.defaults import DEFAULT_PROFILE_YAML, default_profile, placement_registry
from gangline.core.framework.profile import load_profile_file
from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobPending
from gangline.queues_file import load_queues
from gangline.sim.gated import GatedPolicy
from gangline.sim.metrics import summarize
from gangline.sim.simulator import Simulator
from gangline.sim.trace import TraceJob, load_trace
from services.quota.handlers import SOURCE as QUOTA
from services.tools.simulate import simulate_services
from services.tools.simulate.engine import EPOCH

WORLD = Path(__file__).resolve().parent / "engines"
QUEUES = WORLD / "queues.yaml"

Grant = tuple[float, str, tuple[tuple[int, str, tuple[str, ...]], ...]]
"""(virtual time in microseconds, job, per rank (rank, node, GPU ids on the node))."""


def _jobs() -> list[TraceJob]:
    return load_trace(WORLD / "philly-slice.csv", time_scale=2.0)


def _core(
    jobs: list[TraceJob], queues: bool, profile_path: Path | None = None
) -> tuple[list[Grant], dict[str, object]]:
    spec = load_cluster_spec(WORLD / "cluster.yaml")
    profile = (
        default_profile() if profile_path is None else load_profile_file(profile_path, placement_registry())
    )
    policy = GatedPolicy("default", profile, spec.build_nodes(), load_queues(QUEUES) if queues else None)
    result = Simulator(jobs, policy, float(spec.total_gpus)).run()
    grants = [
        (
            round(g.at * 1e6),
            str(g.allocation.job_id),
            tuple(
                (p.rank, str(p.node), tuple(str(x).rsplit("/", 1)[-1] for x in p.gpus))
                for p in g.allocation.placements
            ),
        )
        for g in policy.granted
    ]
    return grants, summarize(result)


def _services(
    jobs: list[TraceJob], queues: bool, profile_path: Path | None = None
) -> tuple[list[Grant], dict[str, object]]:
    spec = load_cluster_spec(WORLD / "cluster.yaml")
    run = simulate_services(
        jobs, spec, queues=QUEUES if queues else None, keep_log=True, profile_path=profile_path
    )
    sim = run.simulation
    grants = [
        (
            round((e.time - EPOCH).total_seconds() * 1e6),
            str(e.data.job_id),
            tuple((p.rank, str(p.node), tuple(str(x) for x in p.gpus)) for p in e.data.placements),
        )
        for e in sim.envelopes(sim.topics.allocations)
        if isinstance(e.data, AllocationGranted)
    ]
    return grants, summarize(run.result)


def _rounded(grants: list[Grant]) -> list[Grant]:
    """Times to the millisecond: the services' clock is a datetime (microseconds), the core's a float."""
    return [(round(t / 1000), j, where) for t, j, where in grants]


@pytest.mark.parametrize("queues", [True, False], ids=["quotas", "no-quotas"])
def test_both_engines_grant_the_same_jobs_at_the_same_time_on_the_same_gpus(queues: bool) -> None:
    jobs = _jobs()
    core, core_figures = _core(jobs, queues)
    services, services_figures = _services(jobs, queues)
    assert len(core) == len(jobs)
    assert _rounded(core) == _rounded(services)
    for figure in ("mean_wait_s", "p99_wait_s", "mean_jct_s", "utilization"):
        assert core_figures[figure] == pytest.approx(services_figures[figure], rel=1e-9, abs=1e-3)


def test_both_engines_agree_under_the_gates_line_order_and_reservation(tmp_path: Path) -> None:
    """The quota gate's two optional rules (``line_order``, ``gate_reserve``), with a bound short enough
    that jobs of this world starve: the services read them from the profile and decide as the core does."""
    text = DEFAULT_PROFILE_YAML.replace("starvation_s: 259200", "starvation_s: 1800")
    text += "  line_order: shortest-run\n  gate_reserve: true\n"
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    jobs = _jobs()
    core, core_figures = _core(jobs, True, path)
    services, _ = _services(jobs, True, path)
    assert _rounded(core) == _rounded(services)
    plain, plain_figures = _core(jobs, True)
    assert _rounded(core) != _rounded(plain)  # the rules decided something here
    assert core_figures["mean_wait_s"] != plain_figures["mean_wait_s"]


def test_the_world_queues_borrows_and_places_gangs() -> None:
    """What the agreement above covers: waits, multi-worker gangs, and quota lent across the cohort."""
    jobs = _jobs()
    core, figures = _core(jobs, queues=True)
    assert float(figures["mean_wait_s"]) > 600  # type: ignore[arg-type]
    assert any(len(where) >= 2 for _, _, where in core)
    by_id = {j.id: j for j in jobs}
    # GPUs each queue holds over time: team-a holds more than its nominal 16 at some point (it borrows).
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for t, job, where in core:
        j = by_id[job]
        gpus = sum(len(g) for _, _, g in where)
        steps[j.queue].append((t / 1e6, gpus))
        steps[j.queue].append((t / 1e6 + j.duration_s, -gpus))
    peak: dict[str, int] = {}
    for queue, changes in steps.items():
        held = 0
        for _, delta in sorted(changes):
            held += delta
            peak[queue] = max(peak.get(queue, 0), held)
    assert peak["team-a"] > 16
    # And the gate held jobs: quota told some job it waits for quota.
    run = simulate_services(jobs, load_cluster_spec(WORLD / "cluster.yaml"), queues=QUEUES, keep_log=True)
    sim = run.simulation
    held = {
        e.data.job_id
        for e in sim.envelopes(sim.topics.events)
        if isinstance(e.data, JobPending) and e.source == QUOTA and e.data.reasons[0].code == "quota"
    }
    assert len(held) >= 5
