"""Properties of queueing (quotas, fair share, preemption) over random clusters, queues, work, arrivals.

- quota and borrowing limits are never exceeded by admitted work (placed + reserved for preemptors);
- only lower-priority (preempt, reserve) or over-quota (reclaim) preemptible jobs are preempted;
- every preemption plan frees a placement that fits the preemptor (gang, topology) once its
  victims are gone;
- the same input, in any order, gives the same decisions.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from scenarios.dsl import build_snapshot, gpus, job
from scenarios.queue_world import H100, queue

from gangline.core.actions.queueing import (
    PreemptionPolicy,
    QueueDecisions,
    RunFacts,
    build_context,
    held_request,
)
from gangline.core.framework.plan import Plan
from gangline.core.model import (
    Allocation,
    AllocationId,
    Job,
    JobId,
    QueueName,
    Seconds,
    TopologyLevel,
    WorkerPlacement,
)
from gangline.core.queue_profile import fair_profile, run_queue_cycle
from gangline.core.queues import QuotaLedger, QuotaTree, gpu_resource
from gangline.core.snapshot import Snapshot

PROFILE = fair_profile()
WorldT = tuple[Snapshot, QuotaTree, list[Job], dict[JobId, RunFacts], dict[JobId, float]]
RES = gpu_resource(H100)
QUEUES = ["a", "b", "c"]


@st.composite
def worlds(
    draw: st.DrawFn,
) -> tuple[Snapshot, QuotaTree, list[Job], dict[JobId, RunFacts], dict[JobId, float]]:
    n_nodes = draw(st.integers(2, 6))
    nodes = {f"n{k}": gpus(8, leaf=f"L{k % 2}") for k in range(n_nodes)}
    specs = [
        queue(
            q,
            H100=draw(st.integers(0, 24)),
            cohort="lab" if draw(st.booleans()) or q != "c" else None,
            borrowing_limit=draw(st.none() | st.integers(0, 16)),
            lending_limit=draw(st.none() | st.integers(0, 16)),
        )
        for q in QUEUES
    ]
    tree = QuotaTree(specs)
    snap = build_snapshot(nodes)
    ledger = QuotaLedger(tree)
    facts: dict[JobId, RunFacts] = {}
    for k in range(draw(st.integers(0, 14))):
        q = draw(st.sampled_from(QUEUES))
        g = draw(st.sampled_from([2, 4, 8, 8]))
        preemptible = draw(st.sampled_from([True, True, False]))
        j = job(f"r{k}", gpus=g, queue=q, priority=draw(st.integers(0, 3)), preemptible=preemptible)
        i = draw(st.integers(0, n_nodes - 1))
        node = snap.nodes[i]
        free = [gg for gg in snap.node_gpus[i] if snap.g_owner[gg] is None][:g]
        if len(free) < g or not ledger.check(QueueName(q), {RES: g}).fits:
            continue
        placement = WorkerPlacement(0, node.id, tuple(snap.gpus[x].id for x in free))
        alloc = Allocation(AllocationId(f"r{k}.c0"), j.id, (placement,))
        assert snap.grant(j, alloc).ok
        ledger.admit(QueueName(q), {RES: g})
        started = float(draw(st.integers(0, 3000)))
        facts[j.id] = RunFacts(started, expected_end=started + draw(st.integers(100, 10_000)))
    pending: list[Job] = []
    submit: dict[JobId, float] = {}
    for k in range(draw(st.integers(1, 6))):
        g = draw(st.sampled_from([1, 2, 4, 8]))
        w = draw(st.integers(1, 3)) if g == 8 else 1
        j = job(
            f"p{k}",
            gpus=g,
            workers=w,
            queue=draw(st.sampled_from(QUEUES)),
            priority=draw(st.integers(0, 6)),
            preemptible=draw(st.booleans()),
            topology=draw(st.sampled_from([None, "leaf"])) if w > 1 else None,
        )
        if draw(st.booleans()):
            j = replace(j, duration_hint_s=Seconds(draw(st.integers(60, 5000))))
        pending.append(j)
        submit[j.id] = float(k)
    return snap, tree, pending, facts, submit


def _run(
    snap: Snapshot, tree: QuotaTree, jobs: list[Job], facts: dict[JobId, RunFacts], submit: dict[JobId, float]
) -> tuple[Plan, QueueDecisions]:
    ctx = build_context(
        snap,
        tree,
        now=3600.0,
        submit_time=submit,
        run_facts=facts,
        policy=PreemptionPolicy(min_runtime_s=60.0),
    )
    return run_queue_cycle(snap, jobs, PROFILE, ctx, cycle=1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_queue_invariants(
    world: WorldT,
) -> None:
    snap, tree, jobs, facts, submit = world
    before = {jid: r for jid, r in snap.running.items()}
    borrowing_before = QuotaLedger(tree)
    for r in before.values():
        borrowing_before.admit(r.job.queue, held_request(snap, r))
    note(f"queues: {[tree.spec(q) for q in tree.queue_names()]}")
    note(f"running: {[(r.job, r.allocation.placements) for r in before.values()]}")
    plan, decisions = _run(snap, tree, jobs, facts, submit)
    note(f"preemptions: {decisions.preemptions}")
    by_id = {j.id: j for j in jobs}
    for kind in sorted({p.kind for p in decisions.preemptions}):
        event(f"plan: {kind}")
    event(f"placed: {bool(plan.placed)}")

    # Only lower-priority or over-quota preemptible work is preempted. Over quota is judged when the
    # plan is made: running + placed in this cycle (reserve plans come before allocate and need no
    # quota judgement) + earlier plans' reservations - their victims.
    at_decision = borrowing_before
    for pl in plan.placed:
        at_decision.admit(pl.job.queue, {RES: sum(len(w.gpus) for w in pl.allocation.placements)})
    for p in decisions.preemptions:
        preemptor = by_id[p.preemptor]
        for v in p.victims:
            victim = before[v.job_id].job
            over = at_decision.is_borrowing(victim.queue, RES)
            if p.kind == "reclaim":
                assert over and victim.preemptible and victim.queue != preemptor.queue
            elif p.kind == "shrink":
                assert victim.priority < preemptor.priority or over
            else:
                assert victim.preemptible and victim.priority < preemptor.priority
            assert 3600.0 - facts[v.job_id].started_at >= 60.0
        for v in p.victims:
            at_decision.release(before[v.job_id].job.queue, {RES: v.gpus})
        at_decision.admit(preemptor.queue, {RES: sum(len(w.gpus) for w in p.reservation)})

    # Each plan frees a placement that really fits its preemptor, on the state after the cycle.
    after = build_snapshot({n.id: gpus(8, leaf=n.leaf) for n in snap.nodes})
    for jid, r in sorted(before.items()):
        if jid not in {e.job_id for e in plan.evicted}:
            assert after.grant(r.job, r.allocation).ok
    for r in decisions.resizes:
        old = after.release(r.job_id)
        assert old is not None
        assert after.grant(
            old.job, Allocation(AllocationId(f"{r.job_id}@resized"), r.job_id, r.placements)
        ).ok
    for pl in plan.placed:
        if pl.job.id not in after.running:
            assert after.grant(pl.job, pl.allocation).ok
    for p in decisions.preemptions:
        preemptor = by_id[p.preemptor]
        assert preemptor.fewest_workers <= len(p.reservation) <= preemptor.workers
        st_ = after.grant(
            preemptor, Allocation(AllocationId(f"{p.preemptor}@plan"), p.preemptor, p.reservation)
        )
        assert st_.ok, st_.message
        if preemptor.topology is not None and preemptor.topology.level is TopologyLevel.LEAF:
            assert len({after.nodes[after.node_pos[w.node]].leaf for w in p.reservation}) == 1
    assert not after.check_invariants()

    # Quota and borrowing limits hold for everything admitted (running, placed, reserved).
    final = QuotaLedger(tree)
    for r in after.running.values():
        final.admit(r.job.queue, held_request(after, r))
    total = 0
    for q in tree.queue_names():
        used = final.usage(q, RES)
        total += used if tree.cohort_of(q) is not None else 0
        limit = tree.borrowing_limit(q, RES)
        if limit is not None:
            assert used <= tree.nominal(q, RES) + limit
        if tree.cohort_of(q) is None:
            assert used <= tree.nominal(q, RES)
    assert total <= sum(tree.nominal(q, RES) for q in tree.queue_names() if tree.cohort_of(q) is not None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.randoms(use_true_random=False))
def test_queueing_is_deterministic_whatever_the_input_order(
    world: WorldT,
    rnd: object,
) -> None:
    snap, tree, jobs, facts, submit = world
    plan1, dec1 = _run(snap, tree, jobs, facts, submit)
    shuffled = list(jobs)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    plan2, dec2 = _run(snap.copy(), tree, shuffled, facts, submit)
    assert plan1.canonical_json() == plan2.canonical_json()
    assert repr(dec1) == repr(dec2)
