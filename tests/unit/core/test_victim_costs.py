"""What a victim costs the core's victim search (GPU-hours since its last checkpoint, MIG slices and
milli shares counted by their share of the GPU) and who may be one: reclaim takes only what a queue
borrows, even when a victim that would take it below its nominal quota costs less."""

from __future__ import annotations

from scenarios.dsl import build_snapshot, fabric, gpus, held, job
from scenarios.queue_world import World, queue

from gangline.core.actions.preempt import candidate_rows, gpu_share
from gangline.core.actions.queueing import RunFacts, open_context
from gangline.core.mig import MigProfileName
from gangline.core.model import Allocation, AllocationId, GpuId, MigSlot, Milli, NodeId, WorkerPlacement
from gangline.core.queues import QueueName, QueueSpec
from gangline.core.snapshot import Snapshot

HOUR = 3600.0


def _grant(snap: Snapshot, job_id: str, placement: WorkerPlacement, **spec: object) -> None:
    j = job(job_id, **spec)  # type: ignore[arg-type]
    status = snap.grant(j, Allocation(AllocationId(f"{job_id}.1"), j.id, (placement,)))
    assert status.ok, status.message


def test_slices_and_shares_lose_gpu_hours_by_their_share_whole_gpus_by_their_count() -> None:
    snap = build_snapshot(
        {
            "mig": gpus(1, model="A100-80GB", mode="mig"),
            "shared": gpus(1, mode="shared"),
            "whole": gpus(2),
        }
    )
    on = {n: NodeId(n) for n in ("mig", "shared", "whole")}
    slice_1g = WorkerPlacement(0, on["mig"], (GpuId("mig-g0"),), mig=MigSlot(MigProfileName("1g.10gb"), 0))
    slice_3g = WorkerPlacement(0, on["mig"], (GpuId("mig-g0"),), mig=MigSlot(MigProfileName("3g.40gb"), 4))
    quarter = WorkerPlacement(0, on["shared"], (GpuId("shared-g0"),), milli=Milli(250))
    two = WorkerPlacement(0, on["whole"], (GpuId("whole-g0"), GpuId("whole-g1")))
    _grant(snap, "s1", slice_1g, mig="1g.10gb")
    _grant(snap, "s3", slice_3g, mig="3g.40gb")
    _grant(snap, "q", quarter, milli=250)
    _grant(snap, "w", two, gpus=2)
    assert gpu_share(snap, slice_1g) == 1 / 7 and gpu_share(snap, slice_3g) == 3 / 7
    assert gpu_share(snap, quarter) == 0.25 and gpu_share(snap, two) == 2.0

    # Two hours since each started; "w" checkpointed an hour ago.
    facts = {j: RunFacts(started_at=0.0) for j in snap.running}
    facts[next(j for j in snap.running if j == "w")] = RunFacts(started_at=0.0, last_checkpoint_at=HOUR)
    ctx = open_context(snap, [], now=2 * HOUR, run_facts=facts)
    rows = candidate_rows(snap, list(snap.running.values()), ctx)
    lost = {row[3]: row[1] for row in rows}
    assert lost == {"s1": 2 / 7, "s3": 6 / 7, "q": 0.5, "w": 2.0}


def test_a_mig_job_preempts_the_slice_that_loses_the_least_by_its_share() -> None:
    # One A100 carved 3g + 3g: a 3g waiter must take one of them. The older slice ran 3 h, the
    # newer 2 h since it started: the newer loses less (2 h x 3/7 GPU).
    world = World(
        nodes={"m": gpus(1, model="A100-80GB", mode="mig")},
        queues=[QueueSpec(QueueName("default"), unlimited=True)],
        facts={"old": RunFacts(started_at=0.0), "new": RunFacts(started_at=HOUR)},
        now=3 * HOUR,
    )
    snap = world.snapshot()
    for job_id, start in (("old", 0), ("new", 4)):
        placement = WorkerPlacement(
            0, NodeId("m"), (GpuId("m-g0"),), mig=MigSlot(MigProfileName("3g.40gb"), start)
        )
        _grant(snap, job_id, placement, mig="3g.40gb", preemptible=True)
    out = world.cycle([job("urgent", mig="3g.40gb", priority=5)], snapshot=snap)
    [plan] = out.decisions.preemptions
    [victim] = plan.victims
    assert victim.job_id == "new" and abs(victim.lost_gpu_hours - 2 * 3 / 7) < 1e-6


def test_reclaim_passes_over_a_cheap_borrower_whose_release_would_take_its_queue_below_nominal() -> None:
    # b uses 12 of its 8: b-big (8 GPUs, 10 s since it started) loses the least, but without it b holds
    # 4 of its 8. b-small (4 GPUs, 60 s) is exactly what b borrows: the only admissible victim.
    world = World(
        nodes={"n0": gpus(8), "n1": gpus(8)},
        queues=[queue("a", cohort="lab", borrowing_limit=0, H100=8), queue("b", cohort="lab", H100=8)],
        running=[
            held(job("b-small", 4, queue="b", preemptible=True), {"n0": 4}),
            held(job("b-big", 8, queue="b", preemptible=True), {"n1": 8}),
        ],
        facts={"b-small": RunFacts(started_at=0.0), "b-big": RunFacts(started_at=50.0)},
        now=60.0,
    )
    out = world.cycle([job("a1", 8, queue="a")])
    [plan] = out.decisions.preemptions
    assert plan.kind == "reclaim" and [v.job_id for v in plan.victims] == ["b-small"]


def test_reclaim_frees_one_leaf_for_a_gang_that_needs_one_not_the_cheapest_gpus_by_count() -> None:
    # b borrows 24 GPUs in four 8-GPU jobs, two per leaf. The two cheapest (b0, b2) sit in different
    # leaves; a 2 x 8 gang that must stay in one leaf needs a whole leaf: leaf s0l0 loses 10 + 50 s.
    nodes = fabric(leaves_per_spine=2, nodes_per_leaf=2)
    on = sorted(nodes)  # n0-0-0, n0-0-1 (leaf s0l0), n0-1-0, n0-1-1 (leaf s0l1)
    starts = {"b0": 90.0, "b1": 50.0, "b2": 80.0, "b3": 0.0}
    world = World(
        nodes=nodes,
        queues=[queue("a", cohort="lab", borrowing_limit=0, H100=24), queue("b", cohort="lab", H100=8)],
        running=[
            held(job(j, 8, queue="b", preemptible=True), {node: 8})
            for j, node in zip(starts, on, strict=True)
        ],
        facts={j: RunFacts(started_at=t) for j, t in starts.items()},
        now=100.0,
    )
    out = world.cycle([job("gang", 8, workers=2, queue="a", topology="leaf")])
    [plan] = out.decisions.preemptions
    assert plan.kind == "reclaim" and sorted(v.job_id for v in plan.victims) == ["b0", "b1"]
