"""`places_nothing`: a cycle the simulator may leave out is one that would place and evict nothing."""

from __future__ import annotations

import random
from pathlib import Path

from gangline.cluster_spec import load_cluster_spec
from gangline.core.actions.queueing import open_context, placement_cycle, places_nothing
from gangline.core.defaults import default_profile, placement_registry, profile_path
from gangline.core.framework.profile import load_profile_file
from gangline.core.model import Allocation, AllocationId, Job, JobId, QueueName, WorkerPlacement
from gangline.core.snapshot import Snapshot

TINY = Path(__file__).parents[1] / "sim" / "tiny_cluster.yaml"


def busy(gpus_used: int, *, preemptible: bool = False) -> Snapshot:
    """2 nodes x 8 GPUs, ``gpus_used`` of node n-0 and all 8 of n-1 taken by running jobs."""
    nodes = load_cluster_spec(TINY).build_nodes()
    snap = Snapshot(nodes)
    for jid, node, n in (("r0", nodes[0], gpus_used), ("r1", nodes[1], 8)):
        if not n:
            continue
        job = Job(JobId(jid), QueueName("q"), workers=1, gpus_per_worker=n, preemptible=preemptible)
        placement = WorkerPlacement(0, node.id, tuple(g.id for g in node.gpus[:n]))
        assert snap.grant(job, Allocation(AllocationId(f"{jid}.a"), job.id, (placement,))).ok
    return snap


def gang(jid: str, workers: int, gpus: int) -> Job:
    return Job(JobId(jid), QueueName("q"), workers=workers, gpus_per_worker=gpus, duration_hint_s=60)


def test_nothing_fits_the_free_gpus_so_the_cycle_places_nothing() -> None:
    snap = busy(6)  # 2 GPUs free on n-0
    waiting = [gang("a", 1, 4), gang("b", 2, 2)]
    assert places_nothing(snap, waiting, default_profile())
    assert not places_nothing(snap, [*waiting, gang("c", 1, 2)], default_profile())  # c fits


def test_a_preemptible_job_running_or_an_evicting_action_keeps_the_cycle() -> None:
    waiting = [gang("a", 1, 4)]
    assert not places_nothing(busy(6, preemptible=True), waiting, default_profile())
    fair = load_profile_file(profile_path().parent / "fair.yaml", placement_registry())
    assert not places_nothing(busy(6), waiting, fair)


def test_whenever_it_says_so_the_default_cycle_places_and_evicts_nothing() -> None:
    rng = random.Random(5)
    checked = 0
    for k in range(300):
        snap = busy(rng.randint(0, 8), preemptible=rng.random() < 0.2)
        waiting = [gang(f"w{k}-{i}", rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 8])) for i in range(3)]
        plan, _ = placement_cycle(
            snap,
            waiting,
            {j.id: float(i) for i, j in enumerate(waiting)},
            default_profile(),
            lambda jobs, snap=snap: open_context(snap, jobs, now=100.0),
            head=256,
            cycle=k,
        )
        if places_nothing(snap, waiting, default_profile()):
            checked += 1
            assert not plan.placed and not plan.evicted
    assert checked > 30
