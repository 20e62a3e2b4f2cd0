"""Fairness check on the Philly trace's virtual clusters: GPU-time share against entitlement.

    python -m gangline.sim.fairness_philly [--day N] [--gpus-per-node 8] [--capacity-scale 0.125]
        [--interval-s 300] [--warmup-h 48] [--trace PATH] [--quotas PATH]

Each Philly virtual cluster (VC) of `heliosartifact_philly_vc.csv` becomes a queue whose nominal
quota is its node count x GPUs per node (x ``--capacity-scale``); all queues share one cohort, so
idle quota is lent and reclaimed. Jobs of VCs without a quota go to queue ``unlisted`` with no
nominal quota (they only borrow). The cluster has exactly the quota's GPUs, 8-GPU nodes in leaves
of 32. At full size the 11 VCs' 352 nodes are 2,816 GPUs, while on its busiest day the trace asks
for about 830 GPUs on average (jobs started before the warm-up are not replayed, so less): no
queue would ever wait and fairness would be trivially perfect; at a quarter (704 GPUs) still
nobody waits. So by default every quota is scaled to an eighth (352 GPUs, 44 nodes), where the
busiest queues wait and borrowing, reclaim and fair share decide who runs.
The measured day defaults to the busiest one (see `busiest_day`).

The simulation replays the trace's jobs (submit time, GPU count, duration as the hint) with the
fair profile every ``--interval-s`` seconds, from ``--warmup-h`` hours before the measured day to
its end. Jobs are preemptible and checkpoint at preemption (grace 60 s), then resume with the work
left. Reported, for the measured 24 hours: each queue's GPU-time share, its nominal share, and
what it was entitled to by weighted max-min fairness over its demand at each interval (running +
waiting GPUs, weights = nominal quotas); Jain's index of received / entitled over queues with an
entitlement, and of share / nominal share over queues that wanted at least their nominal share.
Prints a table and one JSON line. Deterministic: no randomness, time is the trace's.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gangline.core.actions.queueing import PreemptionPolicy, RunFacts, build_context
from gangline.core.fairshare import UsageHistory, advance
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
from gangline.core.queue_profile import fair_profile, run_queue_cycle
from gangline.core.queues import CohortName, QueueSpec, QuotaTree, Resource, ResourceQuota, gpu_resource
from gangline.core.snapshot import Snapshot
from gangline.sim.metrics import jain_index, max_min_entitlements
from gangline.sim.trace import TraceJob, load_philly

MODEL = "philly-gpu"
UNLISTED = QueueName("unlisted")
DAY = 86_400.0
TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
DEFAULT_TRACE = TRACES / "pollux-philly" / "philly.csv"
DEFAULT_QUOTAS = TRACES / "summaries-and-vc-quotas" / "heliosartifact_philly_vc.csv"


def load_vc_nodes(path: Path) -> dict[QueueName, int]:
    """``vc,node num`` rows → nodes per VC."""
    with path.open(newline="", encoding="utf-8") as fh:
        return {QueueName(row["vc"]): int(row["node num"]) for row in csv.DictReader(fh)}


def build_nodes(n_nodes: int, gpus_per_node: int) -> list[Node]:
    nodes = []
    for i in range(n_nodes):
        nid = f"philly{i:04d}"
        gpus = tuple(Gpu(GpuId(f"{nid}-g{k}"), k, GpuModel(MODEL), MiB(24_576)) for k in range(gpus_per_node))
        nodes.append(Node(NodeId(nid), gpus, leaf=DomainId(f"leaf{i // 32:03d}"), spine=DomainId("spine0")))
    return nodes


def busiest_day(jobs: Sequence[TraceJob], listed: set[QueueName]) -> int:
    """The 24-hour window (from the first submission) with the most GPU-time asked to run in it.

    Each job counts its GPUs x the part of [submit, submit + duration] inside the window, as if
    it never queued: the day the VCs wanted the most.
    """
    per_day: dict[int, float] = {}
    for j in jobs:
        if j.queue not in listed:
            continue
        s, e = j.submit_s, j.submit_s + j.duration_s
        for d in range(int(s // DAY), int(e // DAY) + 1):
            overlap = min(e, (d + 1) * DAY) - max(s, d * DAY)
            if overlap > 0:
                per_day[d] = per_day.get(d, 0.0) + j.gpus * overlap
    return max(sorted(per_day), key=lambda d: per_day[d])


@dataclass
class _Live:
    job: Job
    started: float
    ends: float


@dataclass
class FairnessRun:
    """Accumulated per-queue GPU-seconds in the measured window."""

    received: dict[QueueName, float] = field(default_factory=dict)
    entitled: dict[QueueName, float] = field(default_factory=dict)
    demand: dict[QueueName, float] = field(default_factory=dict)
    preemptions: int = 0
    placed: int = 0
    cycles: int = 0


def simulate(
    jobs: Sequence[TraceJob],
    vc_nodes: dict[QueueName, int],
    *,
    day: int,
    gpus_per_node: int,
    capacity_scale: float,
    interval_s: float,
    warmup_s: float,
    half_life_s: float,
) -> tuple[FairnessRun, dict[QueueName, int], int]:
    """Replay the window; returns the accumulated run, the nominal quotas and the cluster size."""
    quotas = {q: max(0, int(n * gpus_per_node * capacity_scale)) for q, n in vc_nodes.items()}
    total = sum(quotas.values())
    n_nodes = total // gpus_per_node
    res = gpu_resource(MODEL)
    cohort = CohortName("philly")
    specs = [
        QueueSpec(q, {res: ResourceQuota(quotas[q])}, cohort=cohort, weight=float(max(1, quotas[q])))
        for q in sorted(quotas)
    ]
    specs.append(QueueSpec(UNLISTED, {res: ResourceQuota(0)}, cohort=cohort))
    tree = QuotaTree(specs)
    profile = fair_profile()
    snap = Snapshot.build(build_nodes(n_nodes, gpus_per_node))
    start, measure_from, end = day * DAY - warmup_s, day * DAY, (day + 1) * DAY
    arrivals = [j for j in jobs if start <= j.submit_s < end and j.gpus <= total]
    arrivals.sort(key=lambda j: (j.submit_s, j.id))
    pending: dict[JobId, Job] = {}
    submit: dict[JobId, float] = {}
    live: dict[JobId, _Live] = {}
    remaining: dict[JobId, float] = {}
    checkpointing: dict[JobId, float] = {}
    waiting_for: set[JobId] = set()
    history = UsageHistory(as_of=start)
    run = FairnessRun()
    next_arrival = 0
    t = start
    while t < end:
        # Completions and checkpoints due by t.
        for jid in sorted(live):
            lv = live[jid]
            if jid in checkpointing and checkpointing[jid] <= t:
                snap.release(jid)
                remaining[jid] = max(1.0, lv.ends - t)
                pending[jid] = replace(lv.job, duration_hint_s=Seconds(int(remaining[jid]) + 1))
                del live[jid], checkpointing[jid]
            elif jid not in checkpointing and lv.ends <= t:
                snap.release(jid)
                del live[jid]
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit_s <= t:
            tj = arrivals[next_arrival]
            job = replace(tj.to_job(), preemptible=True, checkpoint_grace_s=Seconds(60))
            if job.queue not in quotas:
                job = replace(job, queue=UNLISTED)
            pending[job.id] = job
            submit[job.id] = tj.submit_s
            remaining[job.id] = tj.duration_s
            next_arrival += 1
        allocation = _allocation(live)
        history = advance(history, allocation, now=t, half_life_s=half_life_s)
        facts = {jid: RunFacts(lv.started, t, lv.ends) for jid, lv in live.items()}
        ctx = build_context(
            snap,
            tree,
            now=t,
            submit_time=submit,
            run_facts=facts,
            history=history,
            policy=PreemptionPolicy(min_runtime_s=600.0, default_grace_s=60.0),
            in_flight=frozenset(checkpointing) | frozenset(waiting_for),
        )
        plan, decisions = run_queue_cycle(snap, list(pending.values()), profile, ctx, cycle=run.cycles)
        run.cycles += 1
        for p in plan.placed:
            st = snap.grant(p.job, p.allocation)
            if not st.ok:
                raise RuntimeError(st.message)
            live[p.job.id] = _Live(p.job, t, t + remaining[p.job.id])
            del pending[p.job.id]
            waiting_for.discard(p.job.id)
            run.placed += 1
        for pp in decisions.preemptions:
            waiting_for.add(pp.preemptor)
            for v in pp.victims:
                checkpointing[v.job_id] = v.checkpoint_deadline
                run.preemptions += 1
        step = min(interval_s, end - t)
        if t >= measure_from:
            _account(run, live, pending, quotas, total, step)
        t += step
    return run, quotas, total


def _allocation(live: dict[JobId, _Live]) -> dict[QueueName, dict[Resource, int]]:
    res = gpu_resource(MODEL)
    out: dict[QueueName, dict[Resource, int]] = {}
    for lv in live.values():
        vec = out.setdefault(lv.job.queue, {})
        vec[res] = vec.get(res, 0) + lv.job.total_gpus
    return out


def _account(
    run: FairnessRun,
    live: dict[JobId, _Live],
    pending: dict[JobId, Job],
    quotas: dict[QueueName, int],
    total: int,
    step: float,
) -> None:
    held: dict[QueueName, float] = {}
    for lv in live.values():
        held[lv.job.queue] = held.get(lv.job.queue, 0.0) + lv.job.total_gpus
    want = dict(held)
    for j in pending.values():
        want[j.queue] = want.get(j.queue, 0.0) + j.total_gpus
    weights = {q: float(max(1, quotas.get(q, 0))) for q in want}
    fair = max_min_entitlements(want, weights, float(total))
    for q in set(want) | set(held):
        run.received[q] = run.received.get(q, 0.0) + held.get(q, 0.0) * step
        run.entitled[q] = run.entitled.get(q, 0.0) + fair.get(q, 0.0) * step
        run.demand[q] = run.demand.get(q, 0.0) + min(want.get(q, 0.0), float(total)) * step


def report(run: FairnessRun, quotas: dict[QueueName, int], total: int) -> dict[str, object]:
    """Print the per-queue table and return the summary."""
    got_all = sum(run.received.values()) or 1.0
    rows = []
    ratios: list[float] = []
    share_ratios: list[float] = []
    for q in sorted(set(run.received) | set(quotas)):
        got = run.received.get(q, 0.0)
        owed = run.entitled.get(q, 0.0)
        nominal_share = quotas.get(q, 0) / total
        share = got / got_all
        wanted_share = run.demand.get(q, 0.0) / (total * DAY)
        if owed > 0:
            ratios.append(got / owed)
        if nominal_share > 0 and wanted_share >= nominal_share:
            share_ratios.append(share / nominal_share)
        rows.append(
            {
                "queue": q,
                "nominal_share": round(nominal_share, 4),
                "gpu_time_share": round(share, 4),
                "wanted_share": round(wanted_share, 4),
                "received_gpu_h": round(got / 3600.0, 1),
                "entitled_gpu_h": round(owed / 3600.0, 1),
            }
        )
    print(f"{'queue':>10} {'nominal':>8} {'share':>8} {'wanted':>8} {'got GPU-h':>10} {'owed GPU-h':>10}")
    for r in rows:
        print(
            f"{r['queue']:>10} {r['nominal_share']:>8.3f} {r['gpu_time_share']:>8.3f}"
            f" {r['wanted_share']:>8.3f} {r['received_gpu_h']:>10.1f} {r['entitled_gpu_h']:>10.1f}"
        )
    out: dict[str, object] = {
        "gpus": total,
        "utilisation": round(got_all / (total * DAY), 4),
        "cycles": run.cycles,
        "placed": run.placed,
        "preempted": run.preemptions,
        "jain_received_over_entitled": round(jain_index(ratios), 4),
        "jain_share_over_nominal_when_wanted": round(jain_index(share_ratios), 4),
        "queues": rows,
    }
    print(
        f"Jain's index, received / max-min entitlement: {out['jain_received_over_entitled']} "
        f"({len(ratios)} queues); share / nominal share (queues that wanted it): "
        f"{out['jain_share_over_nominal_when_wanted']} ({len(share_ratios)} queues)"
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--quotas", type=Path, default=DEFAULT_QUOTAS)
    ap.add_argument("--day", type=int, default=None, help="24 h window index (default: busiest)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--capacity-scale", type=float, default=0.125)
    ap.add_argument("--interval-s", type=float, default=300.0)
    ap.add_argument("--warmup-h", type=float, default=48.0)
    ap.add_argument("--half-life-h", type=float, default=6.0)
    args = ap.parse_args(argv)
    vc_nodes = load_vc_nodes(args.quotas)
    jobs = load_philly(args.trace)
    day = args.day if args.day is not None else busiest_day(jobs, set(vc_nodes))
    run, quotas, total = simulate(
        jobs,
        vc_nodes,
        day=day,
        gpus_per_node=args.gpus_per_node,
        capacity_scale=args.capacity_scale,
        interval_s=args.interval_s,
        warmup_s=args.warmup_h * 3600.0,
        half_life_s=args.half_life_h * 3600.0,
    )
    print(f"day {day}: {total} GPUs, {run.cycles} cycles")
    summary = report(run, quotas, total)
    summary["day"] = day
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
