"""The report of a campaign: JSON (one entry per policy run) and a side-by-side table (pure + files)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gangline.sim.metrics import RunResult, summarize

REPORT_VERSION = 1

TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{}"),
    ("jobs", "jobs", "{}"),
    ("mean wait", "mean_wait_s", "dur"),
    ("p99 wait", "p99_wait_s", "dur"),
    ("mean JCT", "mean_jct_s", "dur"),
    ("util", "utilization", "{:.1%}"),
    ("alloc|wait", "alloc_while_waiting", "{:.1%}"),
    ("frag GPUs", "frag_gpus_mean", "{:.1f}"),
    ("Jain", "jain", "{:.3f}"),
    ("end free", "end_free_gpus", "{:.1f}"),
    ("end frag", "end_frag_gpus", "{:.1f}"),
    ("preempt", "preemptions", "{}"),
    ("reclaim", "reclaims", "{}"),
    ("partial", "partial_gangs", "{}"),
    ("unfinished", "unfinished", "{}"),
    ("sim s", "sim_wall_s", "{:.1f}"),
)


def duration(seconds: float) -> str:
    """A short human duration: 42s, 3.5m, 2.1h, 1.4d."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _cell(value: object, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "dur":
        return duration(float(value))  # type: ignore[arg-type]
    return fmt.format(value)


def build_report(
    results: Sequence[RunResult], *, trace: str, cluster: str, gpus: float, options: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON report document."""
    return {
        "version": REPORT_VERSION,
        "trace": trace,
        "cluster": cluster,
        "gpus": gpus,
        "options": dict(options),
        "runs": [summarize(r) for r in results],
    }


def write_report(report: Mapping[str, Any], path: str | Path) -> None:
    """Write the report as indented JSON with sorted keys."""
    Path(path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def table(runs: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of the runs side by side."""
    head = [c[0] for c in TABLE_COLUMNS]
    rows = [[_cell(r.get(key), fmt) for _, key, fmt in TABLE_COLUMNS] for r in runs]
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(head)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in rows]
    return "\n".join(lines)


def queue_diff(base: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """Per queue: waits, GPU-hours and preemptions of `other` minus `base` (a what-if table)."""
    bq: Mapping[str, Mapping[str, float]] = base.get("per_queue", {})
    oq: Mapping[str, Mapping[str, float]] = other.get("per_queue", {})
    lines = [
        f"what-if: {other['policy']} vs {base['policy']}",
        "| queue | jobs | mean wait | Δ mean wait | p99 wait | Δ p99 wait "
        "| GPU-h | Δ GPU-h | preempt | Δ preempt |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for q in sorted(set(bq) | set(oq)):
        b, o = bq.get(q, {}), oq.get(q, {})

        def d(key: str, b: Mapping[str, float] = b, o: Mapping[str, float] = o) -> float:
            return float(o.get(key, 0.0)) - float(b.get(key, 0.0))

        sign = "+" if d("mean_wait_s") >= 0 else "-"
        sign99 = "+" if d("p99_wait_s") >= 0 else "-"
        lines.append(
            f"| {q} | {int(o.get('jobs', b.get('jobs', 0)))} | {duration(o.get('mean_wait_s', 0.0))} | "
            f"{sign}{duration(abs(d('mean_wait_s')))} | {duration(o.get('p99_wait_s', 0.0))} | "
            f"{sign99}{duration(abs(d('p99_wait_s')))} | {o.get('gpu_hours', 0.0):.1f} | "
            f"{d('gpu_hours'):+.1f} | {int(o.get('preemptions', 0))} | {int(d('preemptions')):+d} |"
        )
    return "\n".join(lines)
