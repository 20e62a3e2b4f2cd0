"""The victim search on a `VictimPool`: same order, same victim sets, and the rules every set keeps.

`find_victims` (candidate objects) and `find_victims_in` on a pool built from plain rows (the
preempt path) must agree exactly; whatever they choose must free a placement that fits, be
minimal, and leave the snapshot as it was.
"""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from scenarios.dsl import Held, build_snapshot, gpus, held, job
from scenarios.queue_world import World, queue

from gangline.core.actions.preempt import placement_oracle
from gangline.core.actions.queueing import PreemptionPolicy, RunFacts
from gangline.core.actions.victims import (
    VictimCandidate,
    VictimPool,
    VictimSet,
    WholeJob,
    find_victims,
    find_victims_in,
)
from gangline.core.framework.cycle import Session
from gangline.core.model import Job, JobId
from gangline.core.queue_profile import fair_profile
from gangline.core.snapshot import Snapshot

# ---- ordering ----

costs = st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 8.0])  # many ties, as with unknown checkpoints
candidate_fields = st.tuples(
    costs, st.integers(0, 8), st.integers(0, 2), st.sampled_from([-math.inf, 1.0, 2.0])
)


@settings(max_examples=200, deadline=None)
@given(st.lists(candidate_fields, max_size=40))
def test_pool_rows_sort_cheapest_per_gpu_then_cost_then_rank_then_id(
    fields: list[tuple[float, int, int, float]],
) -> None:
    cands = [
        VictimCandidate(JobId(f"j{k:02d}"), lost, ((k % 5, g),) if g else (), (prio, started), gpus=g)
        for k, (lost, g, prio, started) in enumerate(fields)
    ]
    rows: list[WholeJob] = [
        (v.lost_gpu_hours / max(v.gpus, 1), v.lost_gpu_hours, v.rank, v.job_id, v.gpus_by_node, v.gpus)
        for v in reversed(cands)  # arrival order must not matter
    ]
    expected = sorted(
        cands, key=lambda v: (v.lost_gpu_hours / max(v.gpus, 1), v.lost_gpu_hours, v.rank, v.job_id)
    )
    from_rows = VictimPool.whole_jobs(rows)
    from_objects = VictimPool.of(cands)
    assert list(from_rows.job_ids) == [v.job_id for v in expected]
    assert list(from_objects.job_ids) == [v.job_id for v in expected]
    assert [from_rows.candidate(r) for r in range(len(from_rows))] == expected


# ---- the search itself, on random clusters ----


def random_world(seed: int) -> tuple[Snapshot, list[Held], dict[JobId, float]]:
    """Two leaves of 3 nodes x 8 GPUs, full of jobs of 1-8 GPUs and 2-node gangs; lost GPU-hours each."""
    rng = random.Random(seed)
    nodes = {f"{leaf}{k}": gpus(8, leaf=leaf) for leaf in "ab" for k in range(3)}
    free = {n: 8 for n in nodes}
    running: list[Held] = []
    k = 0
    for n in nodes:
        while free[n]:
            size = min(free[n], rng.choice((1, 2, 2, 4, 8)))
            pair = next((m for m in nodes if m != n and m[0] == n[0] and free[m] >= size), None)
            if pair is not None and rng.random() < 0.2:
                running.append(
                    held(job(f"g{k}", gpus=size, workers=2, preemptible=True), {n: size, pair: size})
                )
                free[pair] -= size
            else:
                running.append(held(job(f"s{k}", gpus=size, preemptible=True), {n: size}))
            free[n] -= size
            k += 1
    lost = {h.job.id: rng.choice((0.0, 0.25, 1.0, 1.5, 4.0)) * rng.randint(1, 3) for h in running}
    return build_snapshot(nodes, running), running, lost


def candidates(snap: Snapshot, running: list[Held], lost: dict[JobId, float]) -> list[VictimCandidate]:
    out = []
    for h in running:
        by_node = tuple(
            sorted((snap.node_pos[n], len(g) if not isinstance(g, int) else g) for n, g in h.on.items())
        )
        out.append(VictimCandidate(h.job.id, lost[h.job.id], by_node, (h.job.priority,)))
    return out


def fingerprint(snap: Snapshot) -> tuple[object, ...]:
    return (sorted(snap.running), [list(f) for f in snap.free], list(snap.g_owner))


preemptors = [
    job("p-8x1", gpus=8, priority=9),
    job("p-4x2-leaf", gpus=4, workers=2, topology="leaf", priority=9),
    job("p-8x3-leaf", gpus=8, workers=3, topology="leaf", priority=9),
    job("p-2x5", gpus=2, workers=5, priority=9),
    job("p-3x1-node", gpus=3, topology="node", priority=9),
]


def test_pool_search_matches_object_search_and_keeps_the_rules() -> None:
    checked = 0
    for seed in range(12):
        snap, running, lost = random_world(seed)
        cands = candidates(snap, running, lost)
        rows: list[WholeJob] = [
            (v.lost_gpu_hours / max(v.gpus, 1), v.lost_gpu_hours, v.rank, v.job_id, v.gpus_by_node, v.gpus)
            for v in cands
        ]
        for p in preemptors:
            place = placement_oracle(Session(snap, fair_profile(), [p], cycle=1))
            before = fingerprint(snap)
            by_objects = find_victims(snap, p, cands, place)
            by_rows = find_victims_in(snap, p, VictimPool.whole_jobs(list(rows)), place)
            assert fingerprint(snap) == before  # everything rolled back
            assert by_rows == by_objects
            assert by_objects is not None, (
                f"seed {seed}: a full cluster of preemptible jobs frees room for {p.id}"
            )
            assert_fits_and_minimal(snap, p, by_objects)
            checked += 1
    assert checked == 12 * len(preemptors)


def assert_fits_and_minimal(snap: Snapshot, p: Job, found: VictimSet) -> None:
    place = placement_oracle(Session(snap, fair_profile(), [p], cycle=1))
    ids = [v.job_id for v in found.victims]
    assert len(set(ids)) == len(ids)
    assert found.lost_gpu_hours == sum(v.lost_gpu_hours for v in found.victims)
    with snap.transaction():
        for jid in ids:
            snap.release(jid)
        got = place(p)
        assert got is not None
        for s in found.placement.slots:  # the placement found uses only what the victims free
            assert snap.slot_conflict(p, s) is None
    for spared in ids:
        with snap.transaction():
            for jid in ids:
                if jid != spared:
                    snap.release(jid)
            assert place(p) is None, f"{spared} need not be a victim for {p.id}"


# ---- the preempt action: several preemptors in one cycle ----


def test_two_preemptors_of_one_queue_take_disjoint_eligible_victims() -> None:
    nodes = {f"n{k}": gpus(8) for k in range(3)}
    running = [
        held(job("old-a", gpus=8, queue="q", preemptible=True), {"n0": 8}),
        held(job("old-b", gpus=8, queue="q", preemptible=True), {"n1": 8}),
        held(job("young", gpus=8, queue="q", preemptible=True), {"n2": 8}),
    ]
    facts = {
        "old-a": RunFacts(0.0, last_checkpoint_at=3000.0),
        "old-b": RunFacts(0.0, last_checkpoint_at=1000.0),
        "young": RunFacts(3500.0),  # cheapest, but under the minimum runtime
    }
    w = World(
        nodes=nodes,
        queues=[queue("q", H100=24)],
        running=running,
        facts=facts,
        now=3600.0,
        policy=PreemptionPolicy(min_runtime_s=600.0),
    )
    out = w.cycle([job("first", gpus=8, queue="q", priority=9), job("second", gpus=8, queue="q", priority=8)])
    first, second = out.preemption("first"), out.preemption("second")
    assert [v.job_id for v in first.victims] == ["old-a"]  # 600 s lost x 8, not 2600 s
    assert [v.job_id for v in second.victims] == ["old-b"]  # old-a is already taken
    assert out.evicted == {"old-a", "old-b"}
