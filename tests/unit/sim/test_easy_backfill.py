"""`easy-backfill` in the simulator: priority FIFO, a reservation for the head, backfill by time limit."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from gangline.cluster_spec import ClusterSpec, NodeGroup, Topology
from gangline.core.model import GpuModel, JobId, QueueName
from gangline.sim.gated import GatedEasyBackfill
from gangline.sim.metrics import RunResult, summarize
from gangline.sim.policies import EasyBackfill, charged_resources, unlimited_tree
from gangline.sim.run import PolicyRun, run_campaign
from gangline.sim.simulator import SimOptions, Simulator
from gangline.sim.trace import TraceJob, load_trace
from services.tools.cli import main

A100 = GpuModel("A100")


def _spec() -> ClusterSpec:
    return ClusterSpec(
        name="easy",
        topology=Topology(nodes_per_leaf=3),
        groups=(
            NodeGroup(name="e", count=2, gpus_per_node=8, gpu_model=A100, memory_mib=81920),
            NodeGroup(name="f", count=1, gpus_per_node=4, gpu_model=A100, memory_mib=40960),
        ),
    )


def _tj(jid: str, at: float, ran: float, workers: int, gpus: int, limit: float | None) -> TraceJob:
    return TraceJob(JobId(jid), at, ran, QueueName("q"), workers, gpus, time_limit_s=limit)


def _story(limits: bool) -> list[TraceJob]:
    """Two 8-GPU nodes and one 4-GPU node; a 2x8 gang blocked behind a, b; then three 4-GPU jobs."""

    def lim(seconds: float) -> float | None:
        return seconds if limits else None

    return [
        _tj("a", 0, 100, 1, 8, lim(100)),
        _tj("b", 0, 300, 1, 8, lim(300)),
        _tj("gang", 1, 50, 2, 8, lim(100)),
        _tj("wide", 2, 1000, 1, 4, lim(1000)),  # the 4-GPU node is not reserved: starts at once
        _tj("long", 3, 50, 1, 4, lim(1000)),  # runs 50 s, but its limit ends after the reservation
        _tj("short", 4, 50, 1, 4, lim(150)),  # at t=100 its limit ends at 250, before t=300
    ]


def _starts(r: RunResult) -> dict[str, float | None]:
    return {j.id: j.start for j in r.jobs}


def _run(policy: str, jobs: Sequence[TraceJob], **kw: float) -> RunResult:
    (r,) = run_campaign(jobs, _spec(), [PolicyRun(policy)], **kw)
    return r


def test_easy_backfills_a_short_job_ahead_of_the_blocked_gang_and_refuses_a_long_one() -> None:
    starts = _starts(_run("easy-backfill", _story(limits=True)))
    # The gang holds both 8-GPU nodes from t=300 (b's limit); at t=100 a's node frees: short
    # (ends by 250) backfills there, long (limit 1000, though it would run only 50 s) does not.
    assert starts == {
        "a": 0.0,
        "b": 0.0,
        "gang": 300.0,
        "wide": 2.0,
        "long": 350.0,
        "short": 100.0,
    }
    # Without a reservation the long job jumps the gang too, and the gang waits for it.
    greedy = _starts(_run("fifo-gang-best-fit", _story(limits=True)))
    assert greedy["long"] == 100.0 and greedy["short"] == 100.0 and greedy["gang"] == 300.0


def test_without_time_limits_every_job_gets_the_default_limit_not_its_run_time() -> None:
    # One day each: nothing ends before the gang's reservation, so nothing backfills onto its
    # GPUs (the run times, which would let long and short in, are not looked at).
    starts = _starts(_run("easy-backfill", _story(limits=False)))
    assert starts["short"] == 350.0 and starts["long"] == 350.0 and starts["gang"] == 300.0
    # With a 150 s default, b overruns its limit: the gang's reservation is due (at b's expected
    # end, which is now), so still nothing ends before it and nothing backfills.
    starts = _starts(_run("easy-backfill", _story(limits=False), default_time_limit_s=150.0))
    assert starts["short"] == 350.0 and starts["long"] == 350.0 and starts["gang"] == 300.0


def test_priority_goes_first_then_submit_order() -> None:
    jobs = [
        _tj("a", 0, 100, 1, 8, 100),
        _tj("b", 0, 100, 1, 8, 100),
        _tj("f", 0, 100, 1, 4, 100),
        _tj("early", 1, 100, 2, 8, 100),
        TraceJob(JobId("urgent"), 2, 100, QueueName("other"), 2, 8, priority=5, time_limit_s=100),
    ]
    starts = _starts(_run("easy-backfill", jobs))
    assert starts["urgent"] == 100.0 and starts["early"] == 200.0


def _trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    shapes = [(1, 1)] * 6 + [(1, 2), (1, 4), (1, 8), (2, 8), (3, 4), (2, 2), (4, 8)]
    jobs = []
    t = 0.0
    for k in range(n):
        t += rng.expovariate(1 / 40.0)
        w, g = rng.choice(shapes)
        ran = rng.choice([60.0, 300.0, 900.0, 3600.0]) * rng.uniform(0.5, 2.0)
        limit = rng.choice([None, ran * 1.2, ran * 3, 7200.0])  # some jobs overrun their limit
        jobs.append(
            TraceJob(
                JobId(f"j{k:04d}"),
                submit_s=round(t),
                duration_s=ran,
                queue=QueueName(rng.choice(["qa", "qb", "qc"])),
                workers=w,
                gpus_per_worker=g,
                priority=rng.choice([0, 0, 0, 1]),
                preemptible=rng.random() < 0.2,  # EASY has no preemption: ignored
                time_limit_s=limit,
            )
        )
    # First in line for ever: 6 x 8 GPUs on five 8-GPU nodes never fits, so it gets no reservation.
    jobs.append(TraceJob(JobId("never"), 5.0, 60.0, QueueName("qa"), 6, 8, priority=2))
    return jobs


def _mixed() -> ClusterSpec:
    return ClusterSpec(
        name="mixed",
        topology=Topology(nodes_per_leaf=3),
        groups=(
            NodeGroup(name="e", count=5, gpus_per_node=8, gpu_model=A100, memory_mib=81920),
            NodeGroup(name="f", count=4, gpus_per_node=4, gpu_model=A100, memory_mib=40960),
        ),
    )


def _easy(prune: bool, jobs: Sequence[TraceJob], cycle_s: float) -> RunResult:
    spec = _mixed()
    nodes = spec.build_nodes()
    core = [j.to_job() for j in jobs]
    policy = EasyBackfill(
        "easy-backfill",
        nodes,
        unlimited_tree({j.queue for j in core}, charged_resources(core, nodes)),
        time_limits={j.id: j.time_limit_s for j in jobs if j.time_limit_s is not None},
        default_time_limit_s=3600.0,
        prune=prune,
    )
    return Simulator(jobs, policy, float(spec.total_gpus), SimOptions(cycle_s=cycle_s)).run()


@pytest.mark.parametrize(("seed", "cycle_s"), [(1, 0.0), (3, 60.0)])
def test_pruned_cycles_decide_exactly_what_full_cycles_decide(seed: int, cycle_s: float) -> None:
    jobs = _trace(400, seed)
    full = _easy(False, jobs, cycle_s)
    pruned = _easy(True, jobs, cycle_s)
    waits = [j.wait for j in full.jobs if j.wait is not None]
    assert max(waits) > 3600  # the trace really queues
    assert {j.id: (j.start, j.end) for j in pruned.jobs} == {j.id: (j.start, j.end) for j in full.jobs}
    assert summarize(pruned)["preemptions"] == 0
    assert {j.id: j.start for j in pruned.jobs}["never"] is None


def test_generic_trace_time_limits_reach_easy_backfill(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = ["submit_time_s,duration_s,workers,gpus_per_worker,queue,job_id,time_limit_s"]
    rows += [
        f"{j.submit_s},{j.duration_s},{j.workers},{j.gpus_per_worker},q,{j.id},{j.time_limit_s}"
        for j in _story(True)
    ]
    trace.write_text("\n".join(rows) + "\n", encoding="utf-8")
    jobs = load_trace(trace)
    assert {j.id: j.time_limit_s for j in jobs} == {j.id: j.time_limit_s for j in _story(True)}
    assert _starts(_run("easy-backfill", jobs))["short"] == 100.0


def test_simulate_tables_compare_easy_backfill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    here = Path(__file__).parent
    rc = main(
        [
            "simulate",
            "--trace", str(here / "tiny_trace.csv"),
            "--cluster", str(here / "tiny_cluster.yaml"),
            "--queues", str(here / "tiny_queues.yaml"),
            "--no-progress",
            "--time-limit-s", "3600",
        ]
    )  # fmt: skip
    assert rc == 0
    rows = [
        line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| ")
    ]
    assert rows[:5] == ["policy", "k8s-first-fit", "fifo-gang-best-fit", "easy-backfill", "default"]


def _gated_easy(jobs: Sequence[TraceJob], cycle_s: float) -> RunResult:
    nodes = _mixed().build_nodes()
    policy = GatedEasyBackfill(
        "easy-backfill",
        nodes,
        time_limits={j.id: j.time_limit_s for j in jobs if j.time_limit_s is not None},
        default_time_limit_s=3600.0,
    )
    return Simulator(jobs, policy, float(_mixed().total_gpus), SimOptions(cycle_s=cycle_s)).run()


@pytest.mark.parametrize("seed", [1, 2])
def test_on_placements_cycle_easy_backfill_decides_what_the_cores_cycle_decides(seed: int) -> None:
    # The gated path (placement's cycle, no gate, no fair share) starts every job when the core's own
    # EASY cycle over every waiting job does. (With periodic cycles they differ: the gated path takes an
    # instant's inputs one by one, as the services do, the core's simulator all in one cycle.)
    jobs = _trace(400, seed)
    full = _easy(False, jobs, 0.0)
    gated = _gated_easy(jobs, 0.0)
    assert {j.id: (j.start, j.end) for j in gated.jobs} == {j.id: (j.start, j.end) for j in full.jobs}
