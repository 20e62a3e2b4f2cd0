"""What the snapshot keeps instead of recomputing is what a fresh computation gives.

* `Snapshot.queue_held` / `queue_running` (read by `build_context` through `held_by_queue`): the
  quota each queue's running jobs hold, against a pass over every running job with `held_request`,
  after grants, releases and transactions undone.
* `Snapshot.version`: renewed by every committed change, brought back by an undone transaction,
  never shared by two snapshots.
* Reserve's earliest-start memo (`QueueContext.start_memo`) kept across cycles, keyed on the
  version: every cycle decides the same as one with no memo.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangline.core.actions.queueing import (
    EarliestStart,
    RunFacts,
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
    Seconds,
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


def _gang(k: int, gpus: int, hint: float | None) -> Job:
    return Job(
        JobId(f"j{k:03d}"),
        QueueName("a"),
        workers=gpus // 8 if gpus >= 8 else 1,
        gpus_per_worker=8 if gpus >= 8 else gpus,
        duration_hint_s=Seconds(hint) if hint is not None else None,
    )


def _world_step(
    snap: Snapshot,
    waiting: dict[JobId, Job],
    submitted: dict[JobId, float],
    facts: dict[JobId, RunFacts],
    memo: dict[tuple[object, ...], EarliestStart] | None,
    now: float,
    cycle: int,
) -> str:
    def context(jobs: list[Job]):  # type: ignore[no-untyped-def]
        ctx = open_context(snap, jobs, now=now, submit_time=submitted, run_facts=facts)
        ctx.start_memo = memo
        return ctx

    plan, decisions = placement_cycle(
        snap, list(waiting.values()), submitted, PROFILE, context, head=256, cycle=cycle
    )
    assert apply_plan(snap, plan) == []
    for p in plan.placed:
        del waiting[p.job.id]
        facts[p.job.id] = RunFacts(started_at=now)
    reservations = [(r.job_id, r.start, r.placements) for r in decisions.reservations]
    return plan.canonical_json().decode() + repr(reservations)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**20), nodes=st.integers(2, 5), steps=st.integers(5, 40))
def test_kept_earliest_starts_decide_as_a_fresh_search(seed: int, nodes: int, steps: int) -> None:
    """Two runs of the same inputs, one keeping reserve's earliest starts across cycles (as the
    gated simulator does), one searching afresh: every cycle's plan and reservations agree."""
    rng = random.Random(seed)
    worlds = [Snapshot([_node(k) for k in range(nodes)]) for _ in range(2)]
    state = [({}, {}, {}) for _ in range(2)]  # waiting, submitted, facts
    memo: dict[tuple[object, ...], EarliestStart] = {}
    now = 0.0
    k = 0
    for cycle in range(steps):
        now += rng.choice([0.0, 30.0, 600.0, 3600.0])
        action = rng.random()
        arrivals: list[Job] = []
        if action < 0.5:
            size = rng.choice([1, 2, 4, 8, 16, 16, 24, 32])
            arrivals.append(_gang(k, size, rng.choice([None, 600.0, 3600.0, 7200.0])))
            k += 1
        outs = []
        for w, (snap, (waiting, submitted, facts)) in enumerate(zip(worlds, state, strict=True)):
            if action >= 0.5 and snap.running:
                # the same running job ends in both worlds (they decide alike, so both hold it)
                victim = sorted(snap.running)[int(action * 1000) % len(snap.running)]
                snap.release(victim)
                facts.pop(victim, None)
            for job in arrivals:
                waiting[job.id] = job
                submitted[job.id] = now
            outs.append(_world_step(snap, waiting, submitted, facts, memo if w == 0 else None, now, cycle))
        assert outs[0] == outs[1]
