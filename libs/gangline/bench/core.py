"""Benchmark of the scheduling core (not a test): placements/s and decision latency.

    python -m gangline.bench.core [--case 1k|10k|waiting-10k|all] [--decisions N] [--cycles N] [--seed S]

A Philly-shaped job mix (93% 1 GPU, 6.5% 2-8 GPUs, 0.5% 16-128 GPUs as 8-GPU workers preferring
one leaf) runs against 8-GPU nodes in leaves of 32 nodes, kept near 90% full: before each new
job, running jobs are released (oldest-random) until the cluster is at most 90% busy. Every
decision is one cycle for one job plus its commit (`run_cycle` + `apply_plan`), timed on one
core. Latencies are process CPU time per decision (`time.process_time`), so other load on a
shared machine does not count; the `wall_*` fields give the wall-clock view of the same run
(gang decisions included). The 10k case also places a 256-GPU leaf-required gang every 200
decisions and reports its p99. The waiting-10k case times the live placement cycle (the placement
service's, `placement_cycle`) with 10,000 jobs waiting on 1,000 nodes (see `waiting_case`).
Each case ends with one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import apply_plan, run_cycle
from gangline.core.framework.profile import Profile
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
    TopologyConstraint,
    TopologyLevel,
    TopologyMode,
)
from gangline.core.snapshot import Snapshot

LEAF_NODES = 32
SPINE_LEAVES = 16
TARGET_BUSY = 0.90


def build_cluster(n_nodes: int, gpus_per_node: int = 8) -> list[Node]:
    """`n_nodes` H100 nodes in leaves of 32 and spines of 16 leaves."""
    nodes = []
    for i in range(n_nodes):
        leaf, spine = i // LEAF_NODES, i // (LEAF_NODES * SPINE_LEAVES)
        nid = f"node{i:05d}"
        gpus = tuple(
            Gpu(GpuId(f"{nid}-g{k}"), k, GpuModel("H100-80GB"), MiB(81920)) for k in range(gpus_per_node)
        )
        nodes.append(
            Node(NodeId(nid), gpus, leaf=DomainId(f"leaf{leaf:04d}"), spine=DomainId(f"spine{spine:03d}"))
        )
    return nodes


def philly_job(rng: random.Random, k: int) -> Job:
    """One job of the Philly-shaped mix."""
    x = rng.random()
    if x < 0.93:
        return Job(JobId(f"j{k}"), QueueName("q"), workers=1, gpus_per_worker=1)
    if x < 0.995:
        g = rng.choice((2, 2, 4, 4, 8))
        return Job(JobId(f"j{k}"), QueueName("q"), workers=1, gpus_per_worker=g)
    total = rng.choice((16, 16, 32, 64, 128))
    return Job(
        JobId(f"j{k}"),
        QueueName("q"),
        workers=total // 8,
        gpus_per_worker=8,
        topology=TopologyConstraint(TopologyLevel.LEAF, TopologyMode.PREFERRED),
    )


def big_gang(k: int) -> Job:
    """The 256-GPU leaf-required gang (32 x 8)."""
    return Job(
        JobId(f"gang{k}"),
        QueueName("q"),
        workers=32,
        gpus_per_worker=8,
        topology=TopologyConstraint(TopologyLevel.LEAF, TopologyMode.REQUIRED),
    )


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`, in the same unit."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run_case(
    name: str, n_nodes: int, decisions: int, seed: int, profile: Profile, gang_every: int = 0
) -> dict[str, object]:
    """Run one case and return its summary (also printed as one JSON line)."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    snap = Snapshot.build(build_cluster(n_nodes))
    build_s = time.perf_counter() - t0
    capacity = sum(snap.capacity)
    running: list[JobId] = []
    walls: list[float] = []
    k = 0
    cycle = 0

    def busy() -> float:
        return 1 - sum(snap.total_free) / capacity

    def decide(job: Job) -> tuple[bool, float]:
        nonlocal cycle
        cycle += 1
        wall0, cpu0 = time.perf_counter(), time.process_time()
        plan = run_cycle(snap, [job], profile, cycle=cycle)
        apply_plan(snap, plan)
        cpu = time.process_time() - cpu0
        walls.append(time.perf_counter() - wall0)
        if plan.placed:
            running.append(job.id)
        return bool(plan.placed), cpu

    def release_to(target: float) -> float:
        start = time.perf_counter()
        while running and busy() > target:
            victim = running.pop(rng.randrange(len(running)))
            snap.release(victim)
        return time.perf_counter() - start

    def drain_emptiest_leaf() -> None:
        leaf_of, free = snap.dom_of[TopologyLevel.LEAF], snap.dom_free[TopologyLevel.LEAF][0]
        leaf = max(range(len(free)), key=lambda d: (free[d], -d))
        for job_id in [
            j
            for j in running
            if any(leaf_of[snap.node_pos[p.node]] == leaf for p in snap.running[j].allocation.placements)
        ]:
            snap.release(job_id)
            running.remove(job_id)

    # warm-up fill to the target, untimed
    while busy() < TARGET_BUSY:
        k += 1
        decide(philly_job(rng, k))
    gc.collect()
    gc.freeze()
    walls.clear()
    latencies: list[float] = []
    gang_latencies: list[float] = []
    placed = refused = gangs_refused = 0
    release_s = 0.0
    for d in range(decisions):
        release_s += release_to(TARGET_BUSY - 0.005)
        if gang_every and d % gang_every == gang_every - 1:
            # make room as a reservation would (drain the emptiest leaf), untimed; time the decision
            drain_emptiest_leaf()
            ok, took = decide(big_gang(d))
            gang_latencies.append(took)
            gangs_refused += not ok
            continue
        k += 1
        ok, took = decide(philly_job(rng, k))
        latencies.append(took)
        placed += ok
        refused += not ok
    total_s = sum(latencies) + sum(gang_latencies)
    out: dict[str, object] = {
        "case": name,
        "nodes": n_nodes,
        "gpus": capacity,
        "decisions": len(latencies),
        "placed": placed,
        "refused": refused,
        "placements_per_s": round(placed / sum(latencies), 1) if latencies else 0.0,
        "decisions_per_s": round(len(latencies) / sum(latencies), 1) if latencies else 0.0,
        "placements_per_s_with_releases": round(placed / (total_s + release_s), 1),
        "p50_ms": round(pct(latencies, 0.50) * 1000, 3),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 3),
        "wall_placements_per_s": round(placed / sum(walls), 1) if walls else 0.0,
        "wall_p50_ms": round(pct(walls, 0.50) * 1000, 3),
        "wall_p99_ms": round(pct(walls, 0.99) * 1000, 3),
        "busy": round(busy(), 3),
        "snapshot_build_s": round(build_s, 3),
    }
    if gang_every:
        out |= {
            "gang256_decisions": len(gang_latencies),
            "gang256_refused": gangs_refused,
            "gang256_p50_ms": round(pct(gang_latencies, 0.50) * 1000, 3),
            "gang256_p99_ms": round(pct(gang_latencies, 0.99) * 1000, 3),
        }
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    gc.unfreeze()
    return out


def waiting_case(
    name: str, n_nodes: int, n_waiting: int, cycles: int, seed: int, profile: Profile
) -> dict[str, object]:
    """The live placement cycle with ``n_waiting`` jobs waiting (the placement service's, from the core:
    `placement_cycle` over every waiting job, its window of `FRONT_OF_LINE` and the jobs the free GPUs
    could hold, the queue facts of `open_context` with each running job's start), then its commit.

    The cluster is kept about 90% busy with the Philly-shaped mix (every fifth job with a duration
    hint, so reserve finds earliest starts); before each cycle a few running jobs end and as many
    jobs arrive as the last cycle placed, so ``n_waiting`` wait every cycle. Each sample is one cycle
    and its commit, in CPU time (`time.process_time`).
    """
    from gangline.core.actions.queueing import RunFacts, open_context, placement_cycle
    from gangline.core.waiting import FRONT_OF_LINE

    rng = random.Random(seed)
    snap = Snapshot.build(build_cluster(n_nodes))
    capacity = sum(snap.capacity)
    admitted: dict[JobId, float] = {}
    facts: dict[JobId, RunFacts] = {}
    waiting: dict[JobId, Job] = {}
    running: list[JobId] = []
    k = 0
    now = 0.0

    def arrive() -> None:
        nonlocal k
        k += 1
        job = philly_job(rng, k)
        if k % 5 == 0:
            job = replace(job, duration_hint_s=Seconds(rng.randint(600, 86_400)))
        waiting[job.id] = job
        admitted[job.id] = now + k * 1e-6

    def cycle(c: int) -> tuple[int, float]:
        cpu0 = time.process_time()
        plan, _ = placement_cycle(
            snap,
            list(waiting.values()),
            admitted,
            profile,
            lambda jobs: open_context(snap, jobs, now=now, submit_time=admitted, run_facts=facts),
            head=FRONT_OF_LINE,
            cycle=c,
        )
        apply_plan(snap, plan)
        took = time.process_time() - cpu0
        for p in plan.placed:
            del waiting[p.job.id]
            facts[p.job.id] = RunFacts(started_at=now)
            running.append(p.job.id)
        return len(plan.placed), took

    for _ in range(n_waiting):
        arrive()
    c = 0
    while 1 - sum(snap.total_free) / capacity < TARGET_BUSY:  # fill, untimed
        c += 1
        now += 1.0
        if not cycle(c)[0]:
            break
        while len(waiting) < n_waiting:
            arrive()
    gc.collect()
    gc.freeze()
    latencies: list[float] = []
    placed = 0
    for _ in range(cycles):
        now += 60.0
        for _ in range(min(len(running), rng.randint(1, 4))):
            victim = running.pop(rng.randrange(len(running)))
            snap.release(victim)
            facts.pop(victim, None)
        c += 1
        n, took = cycle(c)
        latencies.append(took)
        placed += n
        while len(waiting) < n_waiting:
            arrive()
    gc.unfreeze()
    return {
        "case": name,
        "nodes": n_nodes,
        "gpus": capacity,
        "waiting": n_waiting,
        "cycles": len(latencies),
        "placed": placed,
        "p50_ms": round(pct(latencies, 0.50) * 1000, 3),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 3),
        "max_ms": round(max(latencies) * 1000, 3),
        "busy": round(1 - sum(snap.total_free) / capacity, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases and print one JSON line per case."""
    ap = argparse.ArgumentParser(prog="python -m gangline.bench.core", description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("1k", "10k", "waiting-10k", "all"), default="all")
    ap.add_argument("--decisions", type=int, default=20_000)
    ap.add_argument("--cycles", type=int, default=300, help="waiting-10k: cycles timed")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    profile = default_profile()
    if args.case in ("1k", "all"):
        print(json.dumps(run_case("1k-nodes", 1_000, args.decisions, args.seed, profile)), flush=True)
    if args.case in ("10k", "all"):
        out = run_case("10k-nodes", 10_000, args.decisions, args.seed, profile, gang_every=200)
        print(json.dumps(out), flush=True)
    if args.case in ("waiting-10k", "all"):
        out = waiting_case("waiting-10k-1k-nodes", 1_000, 10_000, args.cycles, args.seed, profile)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
