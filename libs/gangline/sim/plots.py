"""PNG plots of a campaign (writes files; matplotlib is imported only here, with the Agg backend).

* `timeline.png`: waiting jobs and GPU utilisation over time, one line per policy.
* `cdf_wait.png` / `cdf_jct.png`: CDFs of queueing delay and JCT per policy (all jobs), and
  `cdf_wait_by_queue_<policy>.png`: per queue (the busiest `max_queues`) for one policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gangline.sim.metrics import RunResult

MAX_POINTS = 4000


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib (pip install -e '.[dev]')") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _thin(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS points, keeping each bucket's maximum (peaks stay visible)."""
    n = len(xs)
    if n <= MAX_POINTS:
        return list(xs), list(ys)
    step = n / MAX_POINTS
    ox: list[float] = []
    oy: list[float] = []
    for k in range(MAX_POINTS):
        lo, hi = int(k * step), max(int(k * step) + 1, int((k + 1) * step))
        ox.append(xs[lo])
        oy.append(max(ys[lo:hi]))
    return ox, oy


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if not values:
        return
    values = sorted(max(v, 1.0) for v in values)
    n = len(values)
    xs, ys = _thin(values, [(k + 1) / n for k in range(n)])
    ax.step(xs, ys, where="post", label=label)


def plot_campaign(
    results: Sequence[RunResult], out_dir: str | Path, *, title: str, max_queues: int = 6
) -> list[Path]:
    """Write the plots for `results` under `out_dir`; the files written."""
    plt = _mpl()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for r in results:
        days = [t / 86400 for t in r.series.t]
        x, y = _thin(days, [float(w) for w in r.series.waiting])
        ax1.plot(x, y, label=r.policy, linewidth=0.8)
        x, y = _thin(days, [100.0 * g / r.capacity_gpus for g in r.series.running])
        ax2.plot(x, y, label=r.policy, linewidth=0.8)
    ax1.set_ylabel("waiting jobs")
    ax1.set_title(title)
    ax1.legend(loc="upper right", fontsize=8)
    ax2.set_ylabel("GPUs running work (%)")
    ax2.set_xlabel("day of trace")
    fig.tight_layout()
    written.append(out / "timeline.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    for kind in ("wait", "jct"):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in results:
            vals = [j.wait if kind == "wait" else j.jct for j in r.jobs]
            _cdf(ax, [v for v in vals if v is not None], r.policy)
        ax.set_xscale("log")
        ax.set_xlabel(f"{'queueing delay' if kind == 'wait' else 'JCT'} (s, values below 1 s shown at 1 s)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{title}: CDF of {'queueing delay' if kind == 'wait' else 'JCT'}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out / f"cdf_{kind}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    for r in results:
        counts: dict[str, int] = {}
        for j in r.jobs:
            counts[j.queue] = counts.get(j.queue, 0) + 1
        busiest = sorted(counts, key=lambda q: (-counts[q], q))[:max_queues]
        fig, (aw, aj) = plt.subplots(1, 2, figsize=(12, 4.5))
        for q in busiest:
            qs = [j for j in r.jobs if j.queue == q]
            _cdf(aw, [j.wait for j in qs if j.wait is not None], f"{q} ({counts[q]})")
            _cdf(aj, [j.jct for j in qs if j.jct is not None], f"{q} ({counts[q]})")
        for ax, what in ((aw, "queueing delay"), (aj, "JCT")):
            ax.set_xscale("log")
            ax.set_xlabel(f"{what} (s)")
            ax.set_ylabel("fraction of jobs")
            ax.legend(fontsize=7)
        fig.suptitle(f"{title}: {r.policy}, per queue")
        fig.tight_layout()
        written.append(out / f"cdf_by_queue_{r.policy}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
