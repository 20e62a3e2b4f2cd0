"""Issue 15's goals, checked on `gangline simulate` reports: does a profile beat every baseline at once?

``python -m gangline.sim.goals REPORT.json [MORE.json ...] [--policy default]`` reads the runs of one or
more reports of the same jobs (the baselines may come from one report, the profile from another) and
prints one markdown table (the baselines, then the profile) and the goals, each met or not:

* mean wait at most a third of ``k8s-first-fit``'s, and below ``easy-backfill``'s;
* p99 wait no higher than the best baseline's;
* utilisation and GPUs busy while work waits at least the best baseline's minus 0.5 points;
* fragmentation (free GPUs no waiting worker fits, while work waits) no higher than the best baseline's;
* Jain's index over queues at least 0.85; no partial gang.

The longest wait is printed beside them (the starvation bound is stated in docs/policy.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BASELINES = ("k8s-first-fit", "fifo-gang-best-fit", "easy-backfill")
SLACK = 0.005
"""Half a point of utilisation."""


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.0f} s"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def runs_of(reports: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Every run of the reports by policy name (a later report's run of the same name wins)."""
    out: dict[str, Mapping[str, Any]] = {}
    for report in reports:
        for run in report["runs"]:
            out[str(run["policy"])] = run
    return out


def goals(runs: Mapping[str, Mapping[str, Any]], policy: str) -> list[tuple[str, bool, str]]:
    """(goal, met, the figures behind it) for ``policy`` against the baselines in ``runs``."""
    me = runs[policy]
    base = [runs[b] for b in BASELINES if b in runs]
    if not base:
        raise ValueError("no baseline runs in the reports")
    out: list[tuple[str, bool, str]] = []
    mean = float(me["mean_wait_s"])
    if "k8s-first-fit" in runs:
        k8s = float(runs["k8s-first-fit"]["mean_wait_s"])
        out.append(
            (
                "mean wait <= 1/3 of k8s-first-fit's",
                mean <= k8s / 3,
                f"{_duration(mean)} vs {_duration(k8s / 3)}",
            )
        )
    if "easy-backfill" in runs:
        easy = float(runs["easy-backfill"]["mean_wait_s"])
        out.append(("mean wait < easy-backfill's", mean < easy, f"{_duration(mean)} vs {_duration(easy)}"))
    best_p99 = min(float(b["p99_wait_s"]) for b in base)
    p99 = float(me["p99_wait_s"])
    out.append(("p99 wait <= best baseline's", p99 <= best_p99, f"{_duration(p99)} vs {_duration(best_p99)}"))
    for key, label in (("utilization", "utilisation"), ("alloc_while_waiting", "GPUs busy while work waits")):
        values = [float(b[key]) for b in base if b.get(key) is not None]
        mine = me.get(key)
        if not values or mine is None:
            continue
        best = max(values)
        out.append(
            (f"{label} >= best - 0.5 pt", float(mine) >= best - SLACK, f"{_pct(mine)} vs {_pct(best)}")
        )
    frag, best_frag = float(me["frag_gpus_mean"]), min(float(b["frag_gpus_mean"]) for b in base)
    out.append(
        ("fragmentation <= best baseline's", frag <= best_frag + 1e-9, f"{frag:.1f} vs {best_frag:.1f}")
    )
    jain = float(me["jain"])
    out.append(("Jain >= 0.85", jain >= 0.85, f"{jain:.3f}"))
    partial = int(me["partial_gangs"])
    out.append(("0 partial gangs", partial == 0, str(partial)))
    return out


def table(runs: Mapping[str, Mapping[str, Any]], policies: Sequence[str]) -> str:
    head = (
        "| policy | mean wait | p99 wait | max wait | utilisation | GPUs busy while work waits | frag GPUs "
        "| Jain | partial gangs |"
    )
    rows = [head, "|" + "---|" * 9]
    for name in policies:
        r = runs[name]
        rows.append(
            f"| {name} | {_duration(r['mean_wait_s'])} | {_duration(r['p99_wait_s'])} | "
            f"{_duration(r.get('max_wait_s'))} | {_pct(r['utilization'])} | "
            f"{_pct(r.get('alloc_while_waiting'))} | "
            f"{float(r['frag_gpus_mean']):.1f} | {float(r['jain']):.3f} | {r['partial_gangs']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gangline.sim.goals", description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--policy", default="default")
    args = p.parse_args(argv)
    runs = runs_of([json.loads(r.read_text(encoding="utf-8")) for r in args.reports])
    shown = [b for b in BASELINES if b in runs] + [args.policy]
    print(table(runs, shown))
    print()
    checks = goals(runs, args.policy)
    for goal, met, figures in checks:
        print(f"- {'met' if met else 'NOT met'}: {goal} ({figures})")
    print(json.dumps({"policy": args.policy, "met": sum(m for _, m, _ in checks), "goals": len(checks)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
