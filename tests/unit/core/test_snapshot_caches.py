"""What the snapshot keeps instead of recomputing is what a fresh computation gives.

* `Snapshot.queue_held` / `queue_running` (read by `build_context` through `held_by_queue`): the
  quota each queue's running jobs hold, against a pass over every running job with `held_request`,
  after grants, releases and transactions undone.
* `Snapshot.version`: renewed by every committed change, brought back by an undone transaction,
  never shared by two snapshots.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangline.core.actions.queueing import (
    held_by_queue,
    held_request,
    open_context,
    open_tree,
    placement_cycle,
)
from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import apply_plan
from gangline.core.model import (
    DomainId,
    Gpu,
    GpuId,
    GpuModel,
    Job,
    JobId,
    MiB,
    Node,
    NodeId,
    QueueName,
)
from gangline.core.queues import QueueSpec, QuotaTree, Resource
from gangline.core.snapshot import Snapshot
from tests.unit.core.test_core_properties import clusters, job_lists

PROFILE = default_profile()
QUEUES = [QueueName(q) for q in ("a", "b", "c")]


def fresh_held(snap: Snapshot, tree: QuotaTree) -> dict[QueueName, dict[Resource, int]]:
    """What `build_context` summed before the snapshot kept it: every running job, one by one."""
    out: dict[QueueName, dict[Resource, int]] = {}
    for r in snap.running.values():
        if not tree.has_queue(r.job.queue):
            continue
        vec = out.setdefault(r.job.queue, {})
        for res, n in held_request(snap, r).items():
            vec[res] = vec.get(res, 0) + n
    return out


def _requeue(jobs: list[Job], rng: random.Random, prefix: str) -> list[Job]:
    fields = Job.__dataclass_fields__
    return [
        Job(
            **{
                **{f: getattr(j, f) for f in fields},
                "id": JobId(f"{prefix}{j.id}"),
                "queue": rng.choice(QUEUES),
            }
        )
        for j in jobs
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=clusters(),
    waves=st.lists(job_lists("w"), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_queue_held_is_a_pass_over_the_running_jobs(
    nodes: list[Node], waves: list[list[Job]], seed: int
) -> None:
    rng = random.Random(seed)
    snap = Snapshot.build(nodes)
    tree = QuotaTree([QueueSpec(q, unlimited=True) for q in QUEUES[:2]])  # "c" is not in the tree
    everyone = QuotaTree([QueueSpec(q, unlimited=True) for q in QUEUES])
    for c, wave in enumerate(waves):
        wave = _requeue(wave, rng, f"c{c}-")
        plan, _ = placement_cycle(
            snap, wave, {}, PROFILE, lambda jobs: open_context(snap, jobs, now=0.0), head=256, cycle=c
        )
        assert apply_plan(snap, plan) == []
        assert held_by_queue(snap, tree) == fresh_held(snap, tree)
        assert held_by_queue(snap, everyone) == fresh_held(snap, everyone)
        assert snap.queue_running == {
            q: n for q in QUEUES if (n := sum(1 for r in snap.running.values() if r.job.queue == q))
        }
        names = open_tree(snap, []).queue_names()
        assert set(names) == {r.job.queue for r in snap.running.values()}
        with snap.transaction():  # a what-if release, undone
            for job_id in list(snap.running)[::2]:
                snap.release(job_id)
            assert held_by_queue(snap, everyone) == fresh_held(snap, everyone)
        assert held_by_queue(snap, everyone) == fresh_held(snap, everyone)
        running = sorted(snap.running)
        for _ in range(rng.randint(0, len(running))):
            snap.release(running.pop(rng.randrange(len(running))))
        assert held_by_queue(snap, everyone) == fresh_held(snap, everyone)


def _gpus(node: str, n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(GpuId(f"{node}-g{k}"), k, GpuModel("H100-80GB"), MiB(81920)) for k in range(n))


def _node(k: int) -> Node:
    nid = f"n{k}"
    return Node(NodeId(nid), _gpus(nid, 8), leaf=DomainId(f"l{k // 2}"), spine=DomainId("s"))


def test_version_is_renewed_by_committed_changes_and_brought_back_by_an_undo() -> None:
    snap = Snapshot([_node(0), _node(1)])
    other = Snapshot([_node(0), _node(1)])
    assert snap.version != other.version
    seen = {snap.version, other.version}
    job = Job(JobId("j"), QueueName("a"), workers=1, gpus_per_worker=2)
    plan, _ = placement_cycle(
        snap, [job], {}, PROFILE, lambda jobs: open_context(snap, jobs, now=0.0), head=256, cycle=1
    )
    assert snap.version in seen  # a cycle works in a transaction: no change
    assert apply_plan(snap, plan) == []
    assert snap.version not in seen
    seen.add(snap.version)
    before = snap.version
    with snap.transaction():
        snap.release(JobId("j"))
        snap.cordon(NodeId("n1"))
    assert snap.version == before
    for change in (
        lambda: snap.cordon(NodeId("n1")),
        lambda: snap.set_gpu_health(GpuId("n0-g7"), False),
        lambda: snap.release(JobId("j")),
    ):
        change()
        assert snap.version not in seen
        seen.add(snap.version)
