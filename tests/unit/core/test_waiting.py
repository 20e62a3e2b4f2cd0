"""The simulator's shortcuts decide exactly what the plain loops decide, on a trace that queues.

`CorePolicy(prune=True)` hands the core only the waiting jobs that could change a cycle
(`gangline.core.waiting`); `PodFirstFit` walks shape lines instead of every waiting job. Both are
compared, job by job, with the plain version on a seeded random trace at about twice the
cluster's capacity, with gangs, mixed worker sizes, queues with quotas and borrowing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from gangline.cluster_spec import ClusterSpec, NodeGroup, Topology
from gangline.core.actions.queueing import open_context, placement_cycle
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.cycle import apply_plan
from gangline.core.framework.profile import load_profile
from gangline.core.mig import MigProfileName
from gangline.core.model import GpuModel, Job, JobId, QueueName
from gangline.core.snapshot import Snapshot
from gangline.core.waiting import WaitingIndex, cycle_jobs
from gangline.queues_file import QueuesFile
from gangline.sim.metrics import RunResult, fragmentation, fragmentation_of, summarize, worker_need
from gangline.sim.policies import FIFO_GANG_BEST_FIT_YAML, CorePolicy, CycleOutcome, PodFirstFit
from gangline.sim.run import queue_setup
from gangline.sim.simulator import SimOptions, Simulator
from gangline.sim.trace import TraceJob

A100 = GpuModel("A100")


def _spec() -> ClusterSpec:
    return ClusterSpec(
        name="mixed",
        topology=Topology(nodes_per_leaf=3),
        groups=(
            NodeGroup(name="e", count=5, gpus_per_node=8, gpu_model=A100, memory_mib=81920),
            NodeGroup(name="f", count=4, gpus_per_node=4, gpu_model=A100, memory_mib=40960),
        ),
    )


# qz has no quota of its own: it runs only on what the cohort lends.
QUEUES = QueuesFile.model_validate(
    {
        "queues": [
            {"name": "qa", "cohort": "all", "quotas": {A100: {"nominal": 32}}},
            {"name": "qb", "cohort": "all", "weight": 2.0, "quotas": {A100: {"nominal": 16}}},
            {"name": "qc", "cohort": "all", "quotas": {A100: {"nominal": 8}}},
            {"name": "qz", "cohort": "all"},
        ]
    }
)


def _trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    shapes = [(1, 1)] * 6 + [(1, 2), (1, 4), (1, 8), (2, 8), (3, 4), (2, 2), (4, 8)]
    jobs = []
    t = 0.0
    for k in range(n):
        t += rng.expovariate(1 / 40.0)
        w, g = rng.choice(shapes)
        jobs.append(
            TraceJob(
                JobId(f"j{k:04d}"),
                submit_s=round(t),  # equal submit times happen: batches of arrivals
                duration_s=rng.choice([60.0, 300.0, 900.0, 3600.0]) * rng.uniform(0.5, 2.0),
                queue=QueueName(rng.choice(["qa", "qa", "qb", "qc", "qz"])),
                workers=w,
                gpus_per_worker=g,
                priority=rng.choice([0, 0, 0, 1]),
            )
        )
    return jobs


def _core(prune: bool, queues: bool, jobs: Sequence[TraceJob], cycle_s: float) -> RunResult:
    spec = _spec()
    if queues:
        profile = default_profile()
        setup = queue_setup(QUEUES, spec, spec.build_nodes(), jobs)
    else:
        profile = load_profile(FIFO_GANG_BEST_FIT_YAML, placement_registry())
        setup = None
    policy = CorePolicy("p", profile, spec.build_nodes(), setup, prune=prune)
    return Simulator(jobs, policy, float(spec.total_gpus), SimOptions(cycle_s=cycle_s)).run()


def _decisions(r: RunResult) -> dict[str, tuple[float | None, float | None]]:
    return {j.id: (j.start, j.end) for j in r.jobs}


def _same_run(a: RunResult, b: RunResult) -> None:
    assert _decisions(a) == _decisions(b)
    sa, sb = summarize(a), summarize(b)
    for key in ("mean_wait_s", "p99_wait_s", "utilization", "jain", "frag_gpus_mean", "partial_gangs"):
        assert sa[key] == sb[key], key


@pytest.mark.parametrize("queues", [False, True], ids=["fifo-gang-best-fit", "default-with-queues"])
@pytest.mark.parametrize(("seed", "cycle_s"), [(1, 0.0), (2, 0.0), (3, 60.0)])
def test_pruned_cycles_decide_exactly_what_full_cycles_decide(
    queues: bool, seed: int, cycle_s: float
) -> None:
    jobs = _trace(500, seed)
    full = _core(False, queues, jobs, cycle_s)
    pruned = _core(True, queues, jobs, cycle_s)
    waits = [j.wait for j in full.jobs if j.wait is not None]
    assert max(waits) > 3600  # the trace really queues, or the comparison would prove little
    _same_run(pruned, full)


class _EveryWaitingPod(PodFirstFit):
    """The plain loop: every waiting job, in submit order, every cycle."""

    def cycle(self, now: float, new: Sequence[JobId] | None = None) -> CycleOutcome:
        if new is not None:
            return super().cycle(now, new)
        started: list[JobId] = []
        failed: dict[tuple[object, ...], int] = {}
        todo = list(self._waiting.values())
        for pj in todo:
            self._bind(pj, failed, now, started)
        for jid in started:
            self._unline(jid)
        partial = tuple(pj.job.id for pj in todo if pj.bound and pj.job.id in self._waiting)
        return CycleOutcome(tuple(started), (), partial)


@pytest.mark.parametrize("seed", [1, 4])
def test_pod_baseline_shape_lines_decide_what_the_plain_loop_decides(seed: int) -> None:
    jobs = _trace(500, seed)
    spec = _spec()
    runs = [
        Simulator(jobs, cls("k8s-first-fit", spec.build_nodes()), float(spec.total_gpus)).run()
        for cls in (PodFirstFit, _EveryWaitingPod)
    ]
    assert runs[1].partial_jobs > 0  # pods of unplaced gangs held GPUs
    _same_run(runs[0], runs[1])


def _job(jid: str, workers: int, gpus: int, queue: str = "q") -> Job:
    return Job(JobId(jid), QueueName(queue), workers, gpus)


def test_index_keeps_per_group_only_the_copies_the_free_gpus_could_hold() -> None:
    snap = Snapshot(_spec().build_nodes())
    idx = WaitingIndex()
    for k in range(10):
        idx.add(_job(f"one-{k}", 1, 1), (float(k), f"one-{k}"))
        idx.add(_job(f"eight-{k}", 1, 8), (float(k), f"eight-{k}"))
        idx.add(_job(f"gang-{k}", 6, 8), (float(k), f"gang-{k}"))
    got = {j.id for _, j in idx.candidates(snap)}
    # 56 free GPUs: ten 1-GPU jobs fit, five 8-GPU workers (five 8-GPU nodes), no 6 x 8 gang.
    assert got == {JobId(f"one-{k}") for k in range(10)} | {JobId(f"eight-{k}") for k in range(5)}
    # A queue whose quota would admit the gangs keeps them: fair order would charge them.
    got = {j.id for _, j in idx.candidates(snap, admit=lambda job, size: 2 if job.workers == 6 else 0)}
    assert {JobId("gang-0"), JobId("gang-1")} <= got and JobId("gang-2") not in got
    idx.remove(JobId("eight-0"))
    assert JobId("eight-5") in {j.id for _, j in idx.candidates(snap)}
    assert len(idx) == 29


def test_fragmentation_from_kept_needs_equals_fragmentation_from_jobs() -> None:
    snap = Snapshot(_spec().build_nodes())
    for waiting, stranded in (([_job("a", 1, 8), _job("c", 1, 8)], 16.0), ([_job("b", 2, 4)], 0.0)):
        needs = {worker_need(j.gpu_type, j.kind, j.gpus_per_worker, j.gpu_milli) for j in waiting}
        assert fragmentation_of(snap, needs) == fragmentation(snap, waiting) == (stranded, 56.0)


def _window_by_index(snap: Snapshot, line: Sequence[Job], head: int) -> list[Job]:
    """`cycle_jobs` as a `WaitingIndex` of the jobs past the head computes it (what it did before)."""
    if len(line) <= head:
        return list(line)
    rest = WaitingIndex()
    for k in range(head, len(line)):
        rest.add(line[k], (float(k), line[k].id))
    kept = rest.candidates(snap)
    kept.sort(key=lambda e: e[0])
    return [*line[:head], *(job for _, job in kept)]


@pytest.mark.parametrize("seed", range(12))
def test_cycle_window_is_the_index_of_the_jobs_past_the_head(seed: int) -> None:
    rng = random.Random(seed)
    snap = Snapshot(_spec().build_nodes())
    running = [_job(f"r{k}", 1, rng.choice([1, 2, 4, 8])) for k in range(rng.randint(0, 12))]
    for job in running:
        plan, _ = placement_cycle(
            snap,
            [job],
            {},
            default_profile(),
            lambda jobs: open_context(snap, jobs, now=0.0),
            head=8,
            cycle=1,
        )
        assert apply_plan(snap, plan) == []
    shapes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 4), (4, 8), (9, 8)]
    line = []
    for k in range(rng.randint(0, 80)):
        workers, gpus = rng.choice(shapes)
        job = _job(f"j{k}", workers, gpus, queue=rng.choice(["qa", "qb"]))
        if rng.random() < 0.2:
            job = replace(job, mig_profile=MigProfileName("1g.10gb"), gpus_per_worker=1)
        line.append(job)
    head = rng.choice([0, 1, 4, 16])
    assert [j.id for j in cycle_jobs(snap, line, head)] == [j.id for j in _window_by_index(snap, line, head)]
