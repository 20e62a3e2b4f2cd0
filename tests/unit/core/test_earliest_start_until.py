"""`earliest_start(..., until=T)`: the search stops once the gang fits by none of the ends up to T and
every later end is known (`BEYOND`), and a cycle that does not explain decides what one that does
decides (the reservation horizon reads only whether the start is beyond it)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from gangline.cluster_spec import load_cluster_spec
from gangline.core.actions.backfill import BEYOND, earliest_start
from gangline.core.actions.queueing import QUEUES, RunFacts, open_context
from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import Session
from gangline.core.model import Allocation, AllocationId, Job, JobId, QueueName, WorkerPlacement
from gangline.core.snapshot import Snapshot
from gangline.queues_file import QueuesFile, queues_of
from gangline.sim.gated import GatedPolicy
from gangline.sim.simulator import Simulator
from gangline.sim.trace import TraceJob

TINY = Path(__file__).parents[1] / "sim" / "tiny_cluster.yaml"
NOW = 1000.0


def two_running(second_end: float | None) -> tuple[Snapshot, dict[JobId, RunFacts]]:
    """2 nodes x 8 GPUs: a 4-GPU job on n-0 ends at NOW + 600; an 8-GPU job on n-1 ends at
    ``second_end`` (None: no known end)."""
    nodes = load_cluster_spec(TINY).build_nodes()
    snap = Snapshot(nodes)
    facts: dict[JobId, RunFacts] = {}
    for jid, node, gpus, end in (("short", nodes[0], 4, NOW + 600), ("long", nodes[1], 8, second_end)):
        job = Job(JobId(jid), QueueName("q"), workers=1, gpus_per_worker=gpus)
        ids = tuple(g.id for g in node.gpus[:gpus])
        assert snap.grant(
            job, Allocation(AllocationId(f"{jid}.a"), job.id, (WorkerPlacement(0, node.id, ids),))
        ).ok
        facts[job.id] = RunFacts(started_at=0.0, expected_end=end)
    return snap, facts


def search(second_end: float | None, until: float | None) -> object:
    snap, facts = two_running(second_end)
    gang = Job(JobId("gang"), QueueName("q"), workers=2, gpus_per_worker=8)
    ctx = open_context(snap, [gang], now=NOW, run_facts=facts)
    session = Session(snap, default_profile(), [gang], cycle=1)
    session.shared[QUEUES] = ctx
    return earliest_start(session, ctx, gang, until=until)


def test_a_gang_that_fits_only_after_until_is_beyond_it() -> None:
    found = search(NOW + 7200, until=None)
    assert isinstance(found, tuple) and found[0] == NOW + 7200
    assert search(NOW + 7200, until=NOW + 3600) is BEYOND
    within = search(NOW + 7200, until=NOW + 7200)
    assert isinstance(within, tuple) and within[0] == NOW + 7200


def test_an_unknown_end_is_searched_through_whatever_until_says() -> None:
    # The gang needs the GPUs of a job with no known end: its start is inf, which the horizon does not
    # treat as far (it reserves), so the search does not stop at ``until``.
    found = search(None, until=NOW + 3600)
    assert isinstance(found, tuple) and math.isinf(found[0])


class Explaining(GatedPolicy):
    """The gated policy with the cycle's explanations on: reserve searches every start in full."""

    def _context(self, jobs: list[Job], now: float):  # type: ignore[no-untyped-def]
        ctx = super()._context(jobs, now)
        ctx.explain = True
        return ctx


QUEUES_FILE = QueuesFile.model_validate(
    {
        "cohorts": [{"name": "all"}],
        "queues": [
            {"name": "a", "cohort": "all", "quotas": {"A100": {"nominal": 8}}},
            {"name": "b", "cohort": "all", "quotas": {"A100": {"nominal": 8}}},
        ],
    }
)


@pytest.mark.parametrize("quotas", [False, True])
def test_the_default_profile_decides_the_same_with_and_without_explanations(quotas: bool) -> None:
    rng = random.Random(12)
    shapes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (2, 4)]
    jobs = [
        TraceJob(
            JobId(f"j{k:03d}"),
            float(k * rng.choice([5, 30, 120])),
            float(rng.choice([30, 900, 3000, 7200, 20000])),
            QueueName(rng.choice("ab")),
            *rng.choice(shapes),
        )
        for k in range(200)
    ]
    nodes = load_cluster_spec(TINY).build_nodes
    runs = []
    for cls in (GatedPolicy, Explaining):
        policy = cls("default", default_profile(), nodes(), queues_of(QUEUES_FILE) if quotas else None)
        Simulator(jobs, policy, 16.0).run()
        runs.append([(g.at, g.allocation) for g in policy.granted])
    assert runs[0] == runs[1]
    assert len(runs[0]) == len(jobs)
