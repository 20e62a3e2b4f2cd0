"""``python -m services.bench.sim_services``: time a trace through the services' own decisions.

    python -m services.bench.sim_services --trace philly.csv \\
        --cluster deploy/clusters/philly-contended.yaml --queues deploy/queues/philly-contended.yaml \\
        [--profile P.yaml] [--limit N] [--runs 3] [--report report.json]

Runs :func:`~services.tools.simulate.trace_run.simulate_services` (what ``gangline simulate --services``
runs) ``--runs`` times, each in a fresh child process (so no run warms the next), and prints each
run's CPU time (the child's process time: far less sensitive than wall time to the machine's other
users, though a loaded box still inflates it) and wall time, then their medians, the machine's load
average before and after, and ends with one JSON line.

Each run also prints a digest of what the services decided: every grant (job, allocation, nodes,
GPUs, virtual time) and every release, in the order they were written, and every job's start and
end as measured. Two runs, or two versions of the code, that decide the same have the same digest
(``--report`` writes the first run's JSON report; compare two with the ``sim_wall_s`` left out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.bench.sim_services", description="time a trace through the services"
    )
    p.add_argument("--trace", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--queues", type=Path)
    p.add_argument("--profile", type=Path)
    p.add_argument("--limit", type=int)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--report", type=Path, help="write the first run's JSON report here")
    p.add_argument(
        "--progress-s",
        type=float,
        default=0.0,
        help="every this many CPU seconds, print (stderr) the virtual day reached and the grants so far",
    )
    p.add_argument(
        "--every-event",
        action="store_true",
        help="also digest every event every service wrote (topic, id, cause, body): slower, strictest",
    )
    p.add_argument(
        "--engine",
        choices=["services", "core"],
        default="services",
        help="services: the services' handlers (gangline simulate --services); core: the core's gated "
        "simulator (the profile's row of gangline simulate)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process: its figures, times and decision digest."""
    from gangline.cluster_spec import load_cluster_spec
    from gangline.events.allocations import AllocationGranted, AllocationReleased
    from gangline.sim.report import build_report, write_report
    from gangline.sim.trace import load_trace
    from services.tools.simulate import trace_run
    from services.tools.simulate.engine import Transaction

    cpu0, wall0 = time.process_time(), time.perf_counter()
    cpu1 = cpu0
    jobs = load_trace(args.trace, time_scale=args.time_scale, limit=args.limit)
    spec = load_cluster_spec(args.cluster)
    grants = hashlib.sha256()
    events = hashlib.sha256()
    counts = {"granted": 0, "released": 0}
    next_progress = [time.process_time() + args.progress_s]

    def observe(tx: Transaction) -> None:
        if args.progress_s > 0 and time.process_time() >= next_progress[0]:
            next_progress[0] += args.progress_s
            print(
                f"cpu {time.process_time() - cpu1:.0f} s: virtual day {tx.at / 86400:.1f}, "
                f"{counts['granted']} granted",
                file=sys.stderr,
                flush=True,
            )
        for topic, envelope in tx.outputs:
            data = envelope.data
            if args.every_event:
                events.update(f"{topic} {envelope.id} {envelope.causationid} {tx.at!r} ".encode())
                events.update(data.model_dump_json().encode())
            if isinstance(data, AllocationGranted):
                counts["granted"] += 1
                placed = [(p.node, p.rank, tuple(p.gpus)) for p in data.placements]
                grants.update(repr(("g", tx.at, data.job_id, data.allocation_id, placed)).encode())
            elif isinstance(data, AllocationReleased):
                counts["released"] += 1
                grants.update(repr(("r", tx.at, data.allocation_id, data.reason)).encode())

    cpu1, wall1 = time.process_time(), time.perf_counter()
    if args.engine == "core":
        result = _core_run(args, jobs, spec, grants, counts)
    else:
        result = trace_run.simulate_services(
            jobs, spec, queues=args.queues, profile_path=args.profile, observers=[observe]
        ).result
    sim_cpu, sim_wall = time.process_time() - cpu1, time.perf_counter() - wall1
    measured = sorted(result.jobs, key=lambda j: j.id)
    outcomes = hashlib.sha256(repr([(j.id, j.start, j.end, j.preemptions) for j in measured]).encode())
    report = build_report(
        [result], trace=str(args.trace), cluster=spec.name, gpus=float(spec.total_gpus), options={}
    )
    entry = report["runs"][0]
    if args.report:
        write_report(report, args.report)
    return {
        "jobs": len(jobs),
        "sim_cpu_s": round(sim_cpu, 2),
        "sim_wall_s": round(sim_wall, 2),
        "total_cpu_s": round(time.process_time() - cpu0, 2),
        "total_wall_s": round(time.perf_counter() - wall0, 2),
        "mean_wait_s": entry["mean_wait_s"],
        "p99_wait_s": entry["p99_wait_s"],
        "utilization": entry["utilization"],
        "granted": counts["granted"],
        "released": counts["released"],
        "decisions_sha256": grants.hexdigest(),
        "outcomes_sha256": outcomes.hexdigest(),
        "events_sha256": events.hexdigest() if args.every_event else None,
    }


def _core_run(
    args: argparse.Namespace, jobs: Sequence[Any], spec: Any, grants: Any, counts: dict[str, int]
) -> Any:
    """The core's gated simulator under the profile, as `gangline simulate` runs it; every grant
    (time, job, allocation, nodes, GPUs) digested in order, like the services' grants."""
    from gangline.core.defaults import default_profile, placement_registry
    from gangline.core.framework.profile import load_profile_file
    from gangline.queues_file import load_queues_file, queues_of, quota_specs
    from gangline.sim.gated import GatedPolicy
    from gangline.sim.run import entitlement_weights
    from gangline.sim.simulator import SimOptions, Simulator

    profile = load_profile_file(args.profile, placement_registry()) if args.profile else default_profile()
    queues = load_queues_file(args.queues) if args.queues else None
    opts = SimOptions(entitlement=entitlement_weights(quota_specs(queues)[0] if queues else (), jobs))
    gate = queues_of(queues) if queues is not None else None
    policy = GatedPolicy(profile.name, profile, spec.build_nodes(), gate)
    result = Simulator(jobs, policy, float(spec.total_gpus), opts).run()
    for g in policy.granted:
        a = g.allocation
        placed = [(p.node, p.rank, tuple(p.gpus)) for p in a.placements]
        grants.update(repr(("g", g.at, a.job_id, a.id, placed)).encode())
    counts["granted"] = len(policy.granted)
    return result


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    base = [sys.executable, "-m", "services.bench.sim_services", "--child", "--trace", args.trace]
    base += ["--cluster", args.cluster, "--time-scale", str(args.time_scale), "--engine", args.engine]
    for flag, value in (("--queues", args.queues), ("--profile", args.profile), ("--limit", args.limit)):
        if value is not None:
            base += [flag, str(value)]
    load_before = _load()
    runs: list[dict[str, Any]] = []
    for k in range(args.runs):
        cmd = base + (["--report", str(args.report)] if args.report and k == 0 else [])
        cmd += ["--progress-s", str(args.progress_s)] + (["--every-event"] if args.every_event else [])
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        run = json.loads(done.stdout.strip().splitlines()[-1])
        run["load"] = _load()
        runs.append(run)
        print(
            f"run {k + 1}: {run['jobs']} jobs, "
            f"sim {run['sim_cpu_s']:.1f} s CPU / {run['sim_wall_s']:.1f} s wall "
            f"(whole run {run['total_cpu_s']:.1f} / {run['total_wall_s']:.1f} s), load {run['load']}, "
            f"mean wait {run['mean_wait_s'] / 3600:.2f} h, decisions {run['decisions_sha256'][:16]}"
        )
    digests = {(r["decisions_sha256"], r["outcomes_sha256"], r["events_sha256"]) for r in runs}
    summary = {
        "bench": "sim_services",
        "engine": args.engine,
        "trace": args.trace,
        "cluster": args.cluster,
        "queues": str(args.queues) if args.queues else None,
        "profile": str(args.profile) if args.profile else None,
        "limit": args.limit,
        "jobs": runs[0]["jobs"],
        "runs": len(runs),
        "sim_cpu_s_median": statistics.median(r["sim_cpu_s"] for r in runs),
        "sim_wall_s_median": statistics.median(r["sim_wall_s"] for r in runs),
        "sim_cpu_s": [r["sim_cpu_s"] for r in runs],
        "sim_wall_s": [r["sim_wall_s"] for r in runs],
        "load_before": load_before,
        "load_after": _load(),
        "cores": os.cpu_count(),
        "same_decisions_every_run": len(digests) == 1,
        "decisions_sha256": runs[0]["decisions_sha256"],
        "outcomes_sha256": runs[0]["outcomes_sha256"],
        "events_sha256": runs[0]["events_sha256"],
        "mean_wait_s": runs[0]["mean_wait_s"],
        "utilization": runs[0]["utilization"],
    }
    print(
        f"median of {len(runs)}: {summary['sim_cpu_s_median']:.1f} s CPU, "
        f"{summary['sim_wall_s_median']:.1f} s wall; "
        f"load {load_before} -> {summary['load_after']} on {summary['cores']} cores"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
