"""``python -m services.tools.simulate``: a trace through the services' own decisions.

    python -m services.tools.simulate --trace philly.csv --cluster deploy/clusters/philly-contended.yaml \\
        [--queues Q.yaml] [--profile P.yaml] [--limit N] [--time-scale X] [--fail-node NODE@S] \\
        [--report report.json]

Prints the table `gangline simulate` prints (one row: the services under the profile) and the
figures per queue.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gangline.cluster_spec import load_cluster_spec
from gangline.sim.report import build_report, duration, table, write_report
from gangline.sim.trace import load_trace
from services.tools.simulate.trace_run import SimulateOptions, simulate_services


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.tools.simulate",
        description="simulate a trace through the services' own decisions (in memory, virtual clock)",
    )
    p.add_argument("--trace", required=True, help="trace CSV: Philly summary, Alibaba 2023 pods, or generic")
    p.add_argument("--format", default="auto", choices=["auto", "philly", "alibaba", "generic"])
    p.add_argument("--cluster", required=True, help="cluster spec YAML (deploy/clusters/*.yaml)")
    p.add_argument("--queues", type=Path, help="the services' queues file (default: every queue unlimited)")
    p.add_argument("--profile", type=Path, help="placement's profile YAML (default: the services' default)")
    p.add_argument("--limit", type=int, help="only the first N jobs by submit time")
    p.add_argument("--time-scale", type=float, default=1.0, help="divide submit times (2 = twice the load)")
    p.add_argument("--sample-s", type=float, default=300.0, help="fairness/fragmentation sampling period")
    p.add_argument(
        "--heartbeats",
        default="when_needed",
        choices=["when_needed", "always"],
        help="deliver every heartbeat, or only while one can decide something (default)",
    )
    p.add_argument(
        "--fail-node",
        action="append",
        default=[],
        metavar="NODE@SECONDS",
        help="the node goes silent at that virtual time (repeatable)",
    )
    p.add_argument("--report", type=Path, help="write the JSON report here")
    return p


def failure(text: str) -> tuple[float, str]:
    """``NODE@SECONDS`` → (seconds, node)."""
    node, sep, at = text.rpartition("@")
    if not sep or not node:
        raise ValueError(f"--fail-node {text!r}: expected NODE@SECONDS")
    return float(at), node


def main(argv: Sequence[str] | None = None) -> int:
    """0 on success, 2 when an input is unusable."""
    args = parser().parse_args(argv)
    try:
        jobs = load_trace(args.trace, fmt=args.format, time_scale=args.time_scale, limit=args.limit)
        spec = load_cluster_spec(args.cluster)
        run = simulate_services(
            jobs,
            spec,
            queues=args.queues,
            profile_path=args.profile,
            options=SimulateOptions(heartbeats=args.heartbeats, sample_s=args.sample_s),
            failures=[failure(f) for f in args.fail_node],
        )
    except (OSError, ValueError, KeyError) as e:
        print(f"python -m services.tools.simulate: {e}", file=sys.stderr)
        return 2
    report = build_report(
        [run.result],
        trace=str(args.trace),
        cluster=spec.name,
        gpus=float(spec.total_gpus),
        options={"time_scale": args.time_scale, "limit": args.limit, "sample_s": args.sample_s},
    )
    entry = report["runs"][0]
    entry["rejected"] = run.rejected
    print(
        f"{len(jobs)} jobs from {args.trace} on {spec.name} ({spec.node_count} nodes, {spec.total_gpus} GPUs)"
        f", through the services"
    )
    print(table(report["runs"]))
    print(f"sim_wall_s {entry['policy']}: {entry['sim_wall_s']:.1f}; rejected at admission: {run.rejected}")
    print()
    print(per_queue(entry))
    if args.report:
        write_report(report, args.report)
        print(f"report: {args.report}")
    return 0


def per_queue(entry: dict[str, object]) -> str:
    """The run's figures per queue, as a Markdown table."""
    queues = entry.get("per_queue", {})
    assert isinstance(queues, dict)
    lines = [
        "| queue | jobs | mean wait | p99 wait | mean JCT | GPU-h | preempt |",
        "|---|---|---|---|---|---|---|",
    ]
    for q, f in sorted(queues.items()):
        lines.append(
            f"| {q} | {int(f['jobs'])} | {duration(f['mean_wait_s'])} | {duration(f['p99_wait_s'])} | "
            f"{duration(f['mean_jct_s'])} | {f['gpu_hours']:.1f} | {int(f['preemptions'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
