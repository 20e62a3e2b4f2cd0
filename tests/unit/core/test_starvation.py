"""The starvation bound (``settings.starvation_s``): a job that has waited longer than the bound is
served before fair share's order, oldest first, at the quota gate and in placement's order."""

from __future__ import annotations

from gangline.core.actions.queueing import fair_order, open_context
from gangline.core.charging import QuotaCharges
from gangline.core.fairshare import FairOrder, FairShare, Pending
from gangline.core.model import DomainId, Gpu, GpuId, GpuModel, Job, JobId, MiB, Node, NodeId, QueueName
from gangline.core.queues import CohortName, QueueSpec, QuotaTree, Resource, ResourceQuota
from gangline.core.quota_gate import Flavour
from gangline.core.snapshot import Snapshot

GPU = Resource("H100")
A, B = QueueName("heavy"), QueueName("light")
DAY = 86_400.0


def node(name: str) -> Node:
    gpu = [
        Gpu(id=GpuId(f"{name}/gpu{i}"), index=i, model=GpuModel("H100"), memory_mib=MiB(81_920))
        for i in range(8)
    ]
    return Node(id=NodeId(name), gpus=tuple(gpu), leaf=DomainId("leaf-a"), spine=DomainId("spine-0"))


def job(name: str, queue: QueueName, n: int) -> Job:
    return Job(id=JobId(name), queue=queue, workers=1, gpus_per_worker=n)


def test_an_old_job_of_a_heavy_queue_goes_before_a_lighter_queues_newer_job() -> None:
    fair = FairShare(capacity={GPU: 16}, weights={A: 1.0, B: 1.0}, allocation={A: {GPU: 12}})
    items = [Pending(A, 0, 0.0, "old", "old"), Pending(B, 0, 2 * DAY, "new", "new")]

    def served(aged_before: float | None) -> list[str]:
        order = FairOrder(items, fair.clone(), aged_before=aged_before)
        out = []
        while (p := order.next()) is not None:
            out.append(p.item)
            order.admitted({GPU: 1})
        return out

    assert served(None) == ["new", "old"]  # fair share: the light queue first
    assert served(2 * DAY - DAY) == ["old", "new"]  # "old" has waited over a day: it goes first


def charges(starvation_s: float | None) -> QuotaCharges[Job]:
    lab = CohortName("lab")
    tree = QuotaTree([QueueSpec(A, {GPU: ResourceQuota(8)}, lab), QueueSpec(B, {GPU: ResourceQuota(8)}, lab)])
    return QuotaCharges(
        tree,
        lambda j: ([Flavour("H100", {GPU: j.gpus_per_worker})], ()),
        half_life_s=0.0,
        starvation_s=starvation_s,
    )


def arrive(c: QuotaCharges[Job], j: Job, admitted: float, at: float) -> Flavour | None:
    return c.arrive(Pending(j.queue, j.priority, admitted, j.id, j), at)


def gate_order(starvation_s: float | None) -> list[str]:
    c = charges(starvation_s)
    # The heavy queue holds the whole cohort: its own 8 and, borrowed, the light queue's 8.
    assert arrive(c, job("runs", A, 8), 0.0, at=0.0) is not None
    assert arrive(c, job("hog", A, 8), 0.0, at=0.0) is not None
    assert arrive(c, job("heavy-old", A, 8), 10.0, at=10.0) is None
    assert arrive(c, job("light-new", B, 8), 1.5 * DAY, at=1.5 * DAY) is None
    # Room for one 8-GPU job: the first through wins, and fair share says the light queue's.
    c.release(JobId("hog"), at=2 * DAY)
    return [j.id for j, _ in c.let_through("lab", at=2 * DAY)]


def test_the_gate_lets_the_starving_job_through_first() -> None:
    assert gate_order(None) == ["light-new"]  # the light queue's share is lower
    assert gate_order(DAY) == ["heavy-old"]  # waited two days, over the one-day bound


def test_placement_order_serves_the_starving_job_first() -> None:
    snap = Snapshot([node("n0")])
    jobs = [job("heavy-old", A, 8), job("light-new", B, 8)]
    submitted = {JobId("heavy-old"): 0.0, JobId("light-new"): 1.5 * DAY}
    ctx = open_context(snap, jobs, now=2 * DAY, submit_time=submitted)
    ctx.fair.charge(A, {Resource("H100"): 8})  # the heavy queue has work running
    assert [j.id for j in fair_order(jobs, ctx, snap)] == ["light-new", "heavy-old"]
    assert [j.id for j in fair_order(jobs, ctx, snap, starvation_s=DAY)] == ["heavy-old", "light-new"]
