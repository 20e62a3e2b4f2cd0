"""The default profile (reserve + allocate + backfill) decides the same on the pruned cycles.

`CorePolicy(prune=True)` with quotas hands each cycle only the waiting jobs that could be placed
or charged, the first blocked ones per group that reserve could pick, and (when a reservation
starts at a known time) the short jobs backfill could start; without quotas it does so only while
a single queue waits (fair order then charges every job, so any left out could move the others).
`prune=False` hands every waiting job. Both runs are compared job by job and figure by figure on
a seeded trace that queues far deeper than `FRONT` (the old front-of-line window), with gangs,
quotas, borrowing and priorities.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from gangline.cluster_spec import ClusterSpec, cluster_spec_from_mapping
from gangline.core.defaults import DEFAULT_PROFILE_YAML, placement_registry
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.model import GpuModel, Job, JobId, QueueName
from gangline.core.placement import whole_workers_fit
from gangline.core.snapshot import Snapshot
from gangline.core.waiting import FRONT_OF_LINE as FRONT
from gangline.core.waiting import WaitingIndex
from gangline.queues_file import QueuesFile
from gangline.sim.metrics import RunResult, summarize
from gangline.sim.policies import CorePolicy
from gangline.sim.run import queue_setup
from gangline.sim.simulator import SimOptions, Simulator
from gangline.sim.trace import TraceJob

A100 = GpuModel("A100")


def _spec() -> ClusterSpec:
    return cluster_spec_from_mapping(
        {
            "name": "mixed",
            "topology": {"nodes_per_leaf": 3},
            "groups": [
                {"name": "e", "count": 4, "gpu_model": A100, "gpus_per_node": 8, "memory_mib": 81920},
                {"name": "f", "count": 4, "gpu_model": A100, "gpus_per_node": 4, "memory_mib": 40960},
            ],
        }
    )


QUEUES = QueuesFile.model_validate(
    {
        "cohorts": [{"name": "all"}],
        "queues": [
            {"name": "qa", "cohort": "all", "quotas": {A100: {"nominal": 24}}},
            {"name": "qb", "cohort": "all", "weight": 2.0, "quotas": {A100: {"nominal": 16}}},
            {"name": "qc", "cohort": "all", "quotas": {A100: {"nominal": 8}}},
            {"name": "qz", "cohort": "all"},
        ],
    }
)
"""Three queues with quotas and one that only borrows, in one cohort."""


def _trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    shapes = [(1, 1)] * 8 + [(1, 2), (1, 4), (1, 8), (2, 8), (3, 4), (2, 2), (2, 4)]
    jobs = []
    t = 0.0
    for k in range(n):
        t += rng.expovariate(1 / 25.0)
        w, g = rng.choice(shapes)
        jobs.append(
            TraceJob(
                JobId(f"j{k:04d}"),
                submit_s=round(t),
                # Short and long jobs alike: backfill starts the short ones on reserved GPUs.
                duration_s=rng.choice([20.0, 60.0, 600.0, 3600.0, 7200.0]) * rng.uniform(0.5, 2.0),
                queue=QueueName(rng.choice(["qa", "qa", "qb", "qc", "qz"])),  # qz only borrows
                workers=w,
                gpus_per_worker=g,
                priority=rng.choice([0, 0, 0, 1]),
            )
        )
    return jobs


class _Deepest(CorePolicy):
    """The core policy, noting the most jobs that waited at once."""

    deepest = 0

    def cycle(self, now: float, new: Sequence[JobId] | None = None):  # type: ignore[no-untyped-def]
        self.deepest = max(self.deepest, len(self._pending))
        return super().cycle(now, new)


def pruned_profile() -> Profile:
    """The default without the starvation bound, the reservation horizon and shortest-first, under
    which CorePolicy does not prune (they break the pruning's assumptions; see CorePolicy.__post_init__)."""
    text = DEFAULT_PROFILE_YAML.replace(", horizon_s: 3600", "").replace("  starvation_s: 259200\n", "")
    text = text.replace("  short_first_weight: 1.0\n", "")
    assert "horizon_s" not in text and "starvation_s" not in text and "short_first" not in text
    return load_profile(text, placement_registry())


def _run(prune: bool, jobs: Sequence[TraceJob], cycle_s: float, queues: bool) -> tuple[RunResult, int]:
    spec = _spec()
    nodes = spec.build_nodes()
    setup = queue_setup(QUEUES, spec, nodes, jobs) if queues else None
    policy = _Deepest("default", pruned_profile(), nodes, setup, prune=prune)
    result = Simulator(jobs, policy, float(spec.total_gpus), SimOptions(cycle_s=cycle_s)).run()
    return result, policy.deepest


@pytest.mark.parametrize(
    ("seed", "cycle_s", "queues", "one_queue"),
    [(1, 0.0, True, False), (5, 30.0, True, False), (1, 0.0, False, False), (2, 0.0, False, True)],
    ids=["quotas", "quotas-cycle-30s", "no-quotas", "no-quotas-one-queue"],
)
def test_default_profile_pruned_decides_what_full_cycles_decide(
    seed: int, cycle_s: float, queues: bool, one_queue: bool
) -> None:
    """Without quotas fair order charges every job, so pruning applies only while one queue waits."""
    jobs = _trace(700, seed)
    if one_queue:
        jobs = [replace(j, queue=QueueName("qa")) for j in jobs]
    full, deepest = _run(False, jobs, cycle_s, queues)
    pruned, _ = _run(True, jobs, cycle_s, queues)
    assert deepest > FRONT  # deeper than the old window, so only the exact pruning can agree
    assert {j.id: (j.start, j.end) for j in pruned.jobs} == {j.id: (j.start, j.end) for j in full.jobs}
    sp, sf = summarize(pruned), summarize(full)
    sp.pop("sim_wall_s")
    sf.pop("sim_wall_s")
    assert sp == sf


def _job(jid: str, workers: int, gpus: int, hint: int | None) -> Job:
    return Job(JobId(jid), QueueName("q"), workers, gpus, duration_hint_s=hint)  # type: ignore[arg-type]


def test_short_candidates_are_the_first_short_enough_jobs_as_many_as_fit() -> None:
    snap = Snapshot(_spec().build_nodes())  # 48 GPUs free: four 8-GPU and four 4-GPU nodes
    idx = WaitingIndex()
    hints = [900, 30, 500, 20, 10, 40, None, 5, 5, 5]
    for k, h in enumerate(hints):
        idx.add(_job(f"eight-{k}", 1, 8, h), (float(k), f"eight-{k}"))
    # Four 8-GPU workers fit: of the jobs of at most 40 s, the first four in line.
    got = [j.id for _, j in sorted(idx.short_candidates(snap, 40.0), key=lambda e: e[0])]
    assert got == [JobId("eight-1"), JobId("eight-3"), JobId("eight-4"), JobId("eight-5")]
    assert [j.id for _, j in idx.short_candidates(snap, 9.0)] != []
    assert len(idx.short_candidates(snap, 9.0)) == 3
    idx.remove(JobId("eight-3"))
    got = [j.id for _, j in sorted(idx.short_candidates(snap, 40.0), key=lambda e: e[0])]
    assert got == [JobId("eight-1"), JobId("eight-4"), JobId("eight-5"), JobId("eight-7")]
    assert idx.short_candidates(snap, 1.0) == []


def test_whole_workers_fit_counts_workers_node_by_node() -> None:
    snap = Snapshot(_spec().build_nodes())
    assert whole_workers_fit(snap, [0], 8) == 4
    assert whole_workers_fit(snap, [0], 4) == 4 * 2 + 4
    assert whole_workers_fit(snap, [0], 3) == 4 * 2 + 4
    assert whole_workers_fit(snap, [0], 1) == 48
