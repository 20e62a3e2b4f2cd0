"""The held-out workloads and issue 15's goals: the time split (``--skip``), the synthetic trace, and
the goal checks on reports."""

from __future__ import annotations

import random
from pathlib import Path

from gangline.core.model import JobId, QueueName
from gangline.sim.cli import later_part
from gangline.sim.goals import goals
from gangline.sim.synthetic import SHAPES, synthetic_jobs, write_csv
from gangline.sim.trace import TraceJob, load_trace


def test_the_later_part_starts_at_zero_and_keeps_the_gaps() -> None:
    jobs = [TraceJob(JobId(f"j{k}"), 100.0 * k, 10.0, QueueName("q"), 1, 1) for k in range(5)]
    rest = later_part(jobs, 3)
    assert [(j.id, j.submit_s) for j in rest] == [("j3", 0.0), ("j4", 100.0)]
    assert later_part(jobs, 0) == jobs


def test_the_synthetic_trace_is_seeded_gang_heavy_and_reads_as_generic_csv(tmp_path: Path) -> None:
    a = synthetic_jobs(random.Random(15), jobs=2000, gpus=128)
    assert a == synthetic_jobs(random.Random(15), jobs=2000, gpus=128)
    gangs = sum(1 for j in a if j.workers > 1) / len(a)
    one_gpu = sum(1 for j in a if j.workers * j.gpus_per_worker == 1) / len(a)
    assert 0.2 < gangs < 0.35 and 0.2 < one_gpu < 0.3  # Philly: ~80% one-GPU jobs
    assert {(j.workers, j.gpus_per_worker) for j in a} <= {(w, g) for w, g, _ in SHAPES}
    path = tmp_path / "syn.csv"
    write_csv(path, a)
    loaded = load_trace(path)
    assert len(loaded) == 2000 and {j.queue for j in loaded} == {"a", "b", "c", "d"}
    # Offered load near 0.9 of 128 GPUs over the span of the trace.
    span = max(j.submit_time_s for j in a)
    offered = sum(j.workers * j.gpus_per_worker * j.duration_s for j in a) / span / 128
    assert 0.6 < offered < 1.2


def run(policy: str, mean: float, p99: float, busy: float, frag: float, jain: float) -> dict[str, object]:
    return {
        "policy": policy,
        "mean_wait_s": mean,
        "p99_wait_s": p99,
        "utilization": 0.5,
        "alloc_while_waiting": busy,
        "frag_gpus_mean": frag,
        "jain": jain,
        "partial_gangs": 0,
    }


def test_goals_compare_against_the_best_baseline_of_each_figure() -> None:
    runs = {
        "k8s-first-fit": run("k8s-first-fit", 900.0, 5000.0, 0.95, 20.0, 0.6),
        "fifo-gang-best-fit": run("fifo-gang-best-fit", 800.0, 4000.0, 0.96, 16.0, 0.6),
        "easy-backfill": run("easy-backfill", 850.0, 4500.0, 0.97, 12.0, 0.6),
        "default": run("default", 300.0, 4000.0, 0.966, 12.0, 0.9),
    }
    met = {goal: ok for goal, ok, _ in goals(runs, "default")}
    assert all(met.values()), met
    runs["default"] = run("default", 301.0, 4001.0, 0.964, 12.5, 0.8)
    missed = [goal for goal, ok, _ in goals(runs, "default") if not ok]
    assert len(missed) == 5 and "0 partial gangs" not in missed
