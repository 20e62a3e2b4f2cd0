"""Benchmark of the queueing core (not a test): full fair-share cycles/s and preemption-plan latency.

    python -m gangline.bench.queueing [--case cycles-1k|cycles-10k|preempt-1k|all] [--cycles N] [--seed S]

``cycles-*``: N nodes of 8 H100 in leaves of 32, about 90% busy with a Philly-shaped mix of running
jobs spread over 50 queues (one cohort, nominal quotas splitting the cluster, some queues
borrowing), and 10,000 pending jobs across the 50 queues (priorities 0-3, a fifth with duration
hints, 0.5% large gangs). One *full cycle* is `build_context` + `run_queue_cycle` with the fair
profile: fair ordering of all 10,000, reserve, allocate, backfill, elastic, preempt and reclaim.
Reports cycles/s and decisions/s (CPU time of this process), one JSON line per case.

``preempt-1k``: 1,000 nodes, every GPU busy with preemptible priority-0 jobs (1, 2, 4 and 8 GPUs)
that last checkpointed at random times; one 64-GPU gang (8 x 8, leaf required, priority 10)
arrives. Each sample is `build_context` + a full cycle that ends in its preemption plan; the
latency (CPU time) is reported as p50/p99/max over fills x repeats, for the fair profile and for a
preempt-only profile, with the context build's own p50 (a service keeps it incrementally).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Sequence

from gangline.bench.core import build_cluster
from gangline.core.actions.queueing import PreemptionPolicy, RunFacts, build_context
from gangline.core.defaults import placement_registry
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.model import (
    Allocation,
    AllocationId,
    Job,
    JobId,
    QueueName,
    Seconds,
    TopologyConstraint,
    TopologyLevel,
    TopologyMode,
    WorkerPlacement,
)
from gangline.core.queue_profile import fair_profile, run_queue_cycle
from gangline.core.queues import CohortName, QueueSpec, QuotaTree, ResourceQuota, gpu_resource
from gangline.core.snapshot import Snapshot

MODEL = "H100-80GB"
N_QUEUES = 50
NOW = 100_000.0

PREEMPT_ONLY_YAML = """\
name: preempt-only
actions: [allocate, preempt]
plugins:
  - name: priority
  - name: health
  - name: gpu-fit
  - name: gang
    weight: 4
  - name: topology
    weight: 2
  - name: binpack
  - name: quota
"""


def queues(total_gpus: int, rng: random.Random) -> QuotaTree:
    """50 queues in one cohort; nominal quotas split the cluster; weights 1-3."""
    share = total_gpus // N_QUEUES
    return QuotaTree(
        [
            QueueSpec(
                QueueName(f"team{q:02d}"),
                {gpu_resource(MODEL): ResourceQuota(share)},
                cohort=CohortName("org"),
                weight=float(rng.choice((1, 1, 2, 3))),
            )
            for q in range(N_QUEUES)
        ]
    )


def fill(
    snap: Snapshot, rng: random.Random, busy: float, queue_of: Sequence[str], *, preemptible: float
) -> dict[JobId, RunFacts]:
    """Grant single-node jobs of 1-8 GPUs node by node until ``busy`` of all GPUs are held."""
    facts: dict[JobId, RunFacts] = {}
    target = int(busy * len(snap.gpus))
    held = 0
    k = 0
    for i, node in enumerate(snap.nodes):
        free = list(snap.node_gpus[i])
        while free and held < target:
            size = min(len(free), rng.choice((1, 1, 1, 1, 2, 4, 8)))
            gpus, free = free[:size], free[size:]
            jid = JobId(f"run{k:06d}")
            job = Job(
                jid,
                QueueName(rng.choice(queue_of)),
                workers=1,
                gpus_per_worker=size,
                priority=rng.choice((0, 0, 1)),
                preemptible=rng.random() < preemptible,
                checkpoint_grace_s=Seconds(60),
            )
            placement = WorkerPlacement(0, node.id, tuple(snap.gpus[g].id for g in gpus))
            st = snap.grant(job, Allocation(AllocationId(f"{jid}@0"), jid, (placement,)))
            assert st.ok, st.message
            started = NOW - rng.uniform(600, 86_400)
            facts[jid] = RunFacts(
                started,
                last_checkpoint_at=started + rng.uniform(0, NOW - started),
                expected_end=NOW + rng.uniform(60, 86_400) if rng.random() < 0.7 else None,
            )
            held += size
            k += 1
        if held >= target:
            break
    return facts


def pending_jobs(n: int, rng: random.Random) -> tuple[list[Job], dict[JobId, float]]:
    """``n`` Philly-shaped pending jobs across the 50 queues."""
    jobs: list[Job] = []
    submit: dict[JobId, float] = {}
    for k in range(n):
        jid = JobId(f"pend{k:06d}")
        q = QueueName(f"team{rng.randrange(N_QUEUES):02d}")
        x = rng.random()
        if x < 0.93:
            workers, per, topo = 1, 1, None
        elif x < 0.995:
            workers, per, topo = 1, rng.choice((2, 4, 8)), None
        else:
            workers, per = rng.choice((2, 4, 8, 16)), 8
            topo = TopologyConstraint(TopologyLevel.LEAF, TopologyMode.PREFERRED)
        hint = Seconds(rng.randrange(300, 36_000)) if rng.random() < 0.2 else None
        jobs.append(
            Job(
                jid,
                q,
                workers=workers,
                gpus_per_worker=per,
                priority=rng.choice((0, 0, 0, 1, 2, 3)),
                preemptible=rng.random() < 0.3,
                topology=topo,
                duration_hint_s=hint,
            )
        )
        submit[jid] = NOW - rng.uniform(0, 86_400)
    return jobs, submit


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


def cycles_case(name: str, n_nodes: int, n_pending: int, cycles: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    snap = Snapshot.build(build_cluster(n_nodes))
    tree = queues(len(snap.gpus), rng)
    # A skewed spread: a third of the queues hold most of the running work (they borrow).
    names = [f"team{q:02d}" for q in range(N_QUEUES)]
    heavy = names[: N_QUEUES // 3] * 4 + names
    facts = fill(snap, rng, 0.90, heavy, preemptible=0.5)
    jobs, submit = pending_jobs(n_pending, rng)
    profile = fair_profile()
    policy = PreemptionPolicy(min_runtime_s=300.0)
    times: list[float] = []
    placed = preempted = 0
    for c in range(cycles):
        t0 = time.process_time()
        ctx = build_context(snap, tree, now=NOW + c, submit_time=submit, run_facts=facts, policy=policy)
        plan, decisions = run_queue_cycle(snap, jobs, profile, ctx, cycle=c + 1)
        times.append(time.process_time() - t0)
        placed, preempted = len(plan.placed), sum(len(p.victims) for p in decisions.preemptions)
    mean = sum(times) / len(times)
    out: dict[str, object] = {
        "case": name,
        "nodes": n_nodes,
        "gpus": len(snap.gpus),
        "running_jobs": len(snap.running),
        "pending_jobs": n_pending,
        "queues": N_QUEUES,
        "cycles": cycles,
        "cycle_s_mean": round(mean, 3),
        "cycle_s_max": round(max(times), 3),
        "cycles_per_s": round(1.0 / mean, 3),
        "pending_decisions_per_s": round(n_pending / mean, 1),
        "placed_per_cycle": placed,
        "victims_per_cycle": preempted,
    }
    print(json.dumps(out), flush=True)
    return out


def preempt_case(name: str, n_nodes: int, fills: int, repeats: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    profiles: dict[str, Profile] = {
        "fair": fair_profile(),
        "preempt_only": load_profile(PREEMPT_ONLY_YAML, placement_registry()),
    }
    gang = Job(
        JobId("gang64"),
        QueueName("team00"),
        workers=8,
        gpus_per_worker=8,
        priority=10,
        topology=TopologyConstraint(TopologyLevel.LEAF, TopologyMode.REQUIRED),
    )
    lat: dict[str, list[float]] = {k: [] for k in profiles}
    victims: list[int] = []
    lost: list[float] = []
    ctx_ms: list[float] = []
    planned = 0
    for _ in range(fills):
        snap = Snapshot.build(build_cluster(n_nodes))
        tree = QuotaTree(
            [QueueSpec(QueueName("team00"), {gpu_resource(MODEL): ResourceQuota(len(snap.gpus))})]
        )
        facts = fill(snap, rng, 1.0, ["team00"], preemptible=1.0)
        # Everything else is priority 0 here, so any set of victims is allowed.
        for jid, r in list(snap.running.items()):
            if r.job.priority:
                snap.release(jid)
                snap.grant(Job(jid, r.job.queue, 1, r.job.gpus_per_worker, preemptible=True), r.allocation)
        # Long-lived objects are frozen out of the GC, as a long-running service would see them.
        gc.collect()
        gc.freeze()
        for pname, profile in profiles.items():
            for _ in range(repeats):
                t0 = time.process_time()
                ctx = build_context(snap, tree, now=NOW, submit_time={gang.id: NOW}, run_facts=facts)
                t1 = time.process_time()
                _, decisions = run_queue_cycle(snap, [gang], profile, ctx, cycle=1)
                t2 = time.process_time()
                lat[pname].append((t2 - t0) * 1000.0)
                ctx_ms.append((t1 - t0) * 1000.0)
                if decisions.preemptions:
                    planned += 1
                    plan = decisions.preemptions[0]
                    victims.append(len(plan.victims))
                    lost.append(plan.lost_gpu_hours)
        gc.unfreeze()
    out: dict[str, object] = {
        "case": name,
        "nodes": n_nodes,
        "gang_gpus": 64,
        "samples": fills * repeats * len(profiles),
        "plans_found": planned,
        "victims_mean": round(sum(victims) / max(1, len(victims)), 2),
        "lost_gpu_hours_mean": round(sum(lost) / max(1, len(lost)), 3),
        "context_build_p50_ms": round(pct(ctx_ms, 0.50), 2),
    }
    for pname, xs in lat.items():
        out[f"{pname}_p50_ms"] = round(pct(xs, 0.50), 2)
        out[f"{pname}_p99_ms"] = round(pct(xs, 0.99), 2)
        out[f"{pname}_max_ms"] = round(max(xs), 2)
    print(json.dumps(out), flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--case", default="all", choices=["cycles-1k", "cycles-10k", "preempt-1k", "all"])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--fills", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.case in ("cycles-1k", "all"):
        cycles_case("cycles-1k", 1_000, args.pending, args.cycles, args.seed)
    if args.case in ("cycles-10k", "all"):
        cycles_case("cycles-10k", 10_000, args.pending, args.cycles, args.seed)
    if args.case in ("preempt-1k", "all"):
        preempt_case("preempt-1k", 1_000, args.fills, args.repeats, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
