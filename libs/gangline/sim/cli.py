"""`gangline simulate`: run a trace on a cluster under the baselines and one or more profiles.

    gangline simulate --trace philly.csv --cluster deploy/clusters/philly.yaml \\
        --queues deploy/queues/philly.yaml --profile deploy/profiles/default.yaml \\
        --report report.json --plots docs/sim/philly

The cluster is a cluster spec (`gangline.cluster_spec`, the format `fake-nodes` reads); the
queues a queues file (`gangline.queues_file`, the one the services read), optional.

Prints the side-by-side table; `--report` writes the JSON report, `--plots` the PNGs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from gangline.cluster_spec import ClusterSpec, load_cluster_spec
from gangline.core.defaults import profile_path
from gangline.queues_file import load_queues_file, queues_of
from gangline.sim.metrics import RunResult
from gangline.sim.policies import BASELINES, DEFAULT_TIME_LIMIT_S
from gangline.sim.report import build_report, queue_diff, table, write_report
from gangline.sim.run import default_runs, load_profiles, run_campaign
from gangline.sim.simulator import SimOptions
from gangline.sim.trace import TraceJob, load_trace

HELP = "simulate a trace on a cluster: Gangline's profiles against the baselines"


def configure(p: argparse.ArgumentParser) -> None:
    """Arguments of `gangline simulate`."""
    p.add_argument("--trace", required=True, help="trace CSV: Philly summary, Alibaba 2023 pods, or generic")
    p.add_argument("--format", default="auto", choices=["auto", "philly", "alibaba", "generic"])
    p.add_argument("--cluster", required=True, help="cluster spec YAML (deploy/clusters/*.yaml)")
    p.add_argument(
        "--queues",
        type=Path,
        help="queues file (quotas, cohorts: deploy/queues/*.yaml) the profiles run under; default no quotas",
    )
    p.add_argument(
        "--profile",
        action="append",
        default=None,
        help="scheduling profile YAML (repeatable; default deploy/profiles/default.yaml)",
    )
    p.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma-separated baselines to run too ({', '.join(BASELINES)}), or 'none'",
    )
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    p.add_argument("--limit", type=int, help="only the first N jobs by submit time (after --skip)")
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        help="leave out the first N jobs by submit time (a later part of the trace: the time split)",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="divide submit times (2 = twice the load)")
    p.add_argument("--cycle-s", type=float, default=0.0, help="periodic cycles every N virtual seconds")
    p.add_argument("--checkpoint-s", type=float, default=1800.0, help="run time between checkpoints")
    p.add_argument("--sample-s", type=float, default=300.0, help="fairness/fragmentation sampling period")
    p.add_argument("--hold", action="store_true", help="packing experiment: started jobs never end")
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        help="easy-backfill: the time limit of jobs whose trace gives none (seconds; default one day)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


ExtraRun = Callable[[Sequence[TraceJob], ClusterSpec], RunResult]
"""Another engine's run of the same jobs on the same cluster, put in the same table (the ``gangline``
command passes the services' own handlers on the simulator's bus: ``--services``)."""


def later_part(jobs: Sequence[TraceJob], skip: int) -> list[TraceJob]:
    """The jobs after the first ``skip`` (by submit time), their times shifted to start at 0."""
    rest = list(jobs[skip:])
    if not skip or not rest:
        return rest
    t0 = rest[0].submit_s
    return [replace(j, submit_s=j.submit_s - t0) for j in rest]


def run(args: argparse.Namespace, extra: Sequence[ExtraRun] = ()) -> int:
    """Run the campaign (and ``extra``); 0 on success, 2 when an input is unusable."""
    try:
        if args.skip < 0:
            raise ValueError("--skip must be >= 0")
        whole = None if args.limit is None else args.skip + args.limit
        jobs = later_part(
            load_trace(args.trace, fmt=args.format, time_scale=args.time_scale, limit=whole), args.skip
        )
        spec = load_cluster_spec(args.cluster)
        queues = load_queues_file(args.queues) if args.queues is not None else None
        if queues is not None:
            queues_of(queues)  # a bad tree (cycle, unknown parent) fails here, not mid-run
        profiles = load_profiles(args.profile or [profile_path()])
    except (OSError, ValueError, KeyError) as e:
        print(f"gangline simulate: {e}", file=sys.stderr)
        return 2
    baselines = [] if args.baselines == "none" else [b for b in args.baselines.split(",") if b]
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        print(f"gangline simulate: unknown baselines {unknown}; known: {list(BASELINES)}", file=sys.stderr)
        return 2
    options = SimOptions(
        cycle_s=args.cycle_s, checkpoint_s=args.checkpoint_s, sample_s=args.sample_s, hold=args.hold
    )
    if not args.time_limit_s > 0:
        print("gangline simulate: --time-limit-s must be > 0", file=sys.stderr)
        return 2
    results = run_campaign(
        jobs,
        spec,
        default_runs(profiles, baselines),
        queues=queues,
        options=options,
        progress=not args.no_progress,
        default_time_limit_s=args.time_limit_s,
    )
    results += [run_extra(jobs, spec) for run_extra in extra]
    report = build_report(
        results,
        trace=str(args.trace),
        cluster=spec.name,
        gpus=float(spec.total_gpus),
        options={
            "queues": str(args.queues) if args.queues is not None else None,
            "time_scale": args.time_scale,
            "limit": args.limit,
            "skip": args.skip,
            "cycle_s": args.cycle_s,
            "checkpoint_s": args.checkpoint_s,
            "sample_s": args.sample_s,
            "hold": args.hold,
            "time_limit_s": args.time_limit_s,
        },
    )
    print(
        f"{len(jobs)} jobs from {args.trace} on {spec.name} ({spec.node_count} nodes, {spec.total_gpus} GPUs)"
    )
    print(table(report["runs"]))
    for r in report["runs"]:
        print(f"sim_wall_s {r['policy']}: {r['sim_wall_s']:.1f}")
    if len(report["runs"]) > 1 and profiles:
        base = report["runs"][0]
        print()
        print(queue_diff(base, report["runs"][-1]))
    if args.report:
        write_report(report, args.report)
        print(f"report: {args.report}")
    if args.plots:
        from gangline.sim.plots import plot_campaign

        for path in plot_campaign(results, args.plots, title=f"{Path(args.trace).name} on {spec.name}"):
            print(f"plot: {path}")
    return 0
