"""PNG plots of a campaign (writes files; matplotlib is imported only here, with the Agg backend).

* `timeline.png`: one panel per policy (same scales): waiting jobs, and GPUs running work (%);
  `timeline_waiting.png` the same, zoomed on the stretch where work waits (when it is short).
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


COLORS = ("tab:red", "tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:brown")
LINESTYLES = ("-", "--", "-.", ":")


def _style(k: int) -> dict[str, Any]:
    """The k-th policy's colour and dash, the same in every plot (lines that coincide stay visible)."""
    return {"color": COLORS[k % len(COLORS)], "linestyle": LINESTYLES[k % len(LINESTYLES)]}


def thin_by_time(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """At most ~2 x MAX_POINTS points: per equal stretch of x, its first point and its peak.

    By time, not by index, so a quiet stretch with few events keeps its own values, and the last
    point is always kept (the run's tail shows).
    """
    n = len(xs)
    if n <= MAX_POINTS:
        return list(xs), list(ys)
    lo, hi = xs[0], xs[-1]
    width = (hi - lo) / MAX_POINTS or 1.0
    ox: list[float] = []
    oy: list[float] = []
    k = 0
    while k < n:
        b = int((xs[k] - lo) / width)
        end = k
        peak = ys[k]
        while end + 1 < n and int((xs[end + 1] - lo) / width) == b:
            end += 1
            peak = max(peak, ys[end])
        ox.append(xs[k])
        oy.append(ys[k])
        if end > k:  # the stretch's peak, then where it ends
            ox += [xs[k], xs[end]]
            oy += [peak, ys[end]]
        k = end + 1
    return ox, oy


def _cdf(ax: Any, values: list[float], label: str, style: dict[str, Any] | None = None) -> None:
    if not values:
        return
    values = sorted(max(v, 1.0) for v in values)
    n = len(values)
    xs, ys = _thin(values, [(k + 1) / n for k in range(n)])
    ax.step(xs, ys, where="post", label=label, linewidth=1.4, **(style or {}))


def _waiting_span(results: Sequence[RunResult]) -> tuple[float, float] | None:
    """Days from the first to the last moment any policy had work waiting, padded; None when that
    is most of the run anyway (or nothing ever waited)."""
    times = [t for r in results for t, w in zip(r.series.t, r.series.waiting, strict=True) if w]
    ends = [r.series.t[-1] for r in results if r.series.t]
    if not times or not ends:
        return None
    lo, hi, total = min(times), max(times), max(ends)
    if hi - lo > 0.5 * total:
        return None
    pad = 0.1 * (hi - lo) + 3600.0
    return (max(0.0, lo - pad) / 86400, min(total, hi + pad) / 86400)


def _timeline(
    plt: Any, results: Sequence[RunResult], path: Path, title: str, xlim: tuple[float, float] | None = None
) -> Path:
    """One panel per policy (same axes in each): waiting jobs, and GPUs running work on a twin axis.

    With `xlim` (days), only that stretch is drawn, at full resolution.
    """
    n = max(1, len(results))
    fig, axes = plt.subplots(n, 1, figsize=(11, 2.3 * n + 0.9), sharex=True, squeeze=False)
    top = max((max(r.series.waiting, default=0) for r in results), default=0)
    for k, (ax, r) in enumerate(zip((a[0] for a in axes), results, strict=False)):
        days = [t / 86400 for t in r.series.t]
        waiting = [float(w) for w in r.series.waiting]
        running = [100.0 * g / r.capacity_gpus for g in r.series.running]
        if xlim is not None:
            keep = [i for i, d in enumerate(days) if xlim[0] <= d <= xlim[1]]
            days, waiting, running = ([v[i] for i in keep] for v in (days, waiting, running))
        x, y = thin_by_time(days, waiting)
        color = _style(k)["color"]
        ax.fill_between(x, y, step="post", color=color, alpha=0.35, linewidth=0)
        ax.step(x, y, where="post", color=color, linewidth=0.7, label=f"{r.policy}: waiting jobs")
        ax.set_ylim(0, max(1.0, top * 1.05))
        ax.set_ylabel("waiting jobs")
        util = ax.twinx()
        x, y = thin_by_time(days, running)
        util.step(x, y, where="post", color="0.25", linewidth=0.6, label="GPUs running work (%)")
        util.set_ylim(0, 105)
        util.set_ylabel("GPUs busy (%)")
        busy = 100.0 * r.busy_gpu_s / (r.capacity_gpus * max(1e-9, (r.series.t or [0.0])[-1]))
        ax.set_title(f"{r.policy}  (utilisation {busy:.1f}%)", fontsize=9, loc="left")
        lines = ax.get_legend_handles_labels()
        more = util.get_legend_handles_labels()
        # On the twin axis, which is drawn last: the utilisation line must not cross the legend.
        util.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=7, framealpha=0.95)
    axes[-1][0].set_xlabel("day of trace")
    if xlim is not None:
        axes[-1][0].set_xlim(*xlim)
    fig.suptitle(title if xlim is None else f"{title}: while work waits", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_campaign(
    results: Sequence[RunResult], out_dir: str | Path, *, title: str, max_queues: int = 6
) -> list[Path]:
    """Write the plots for `results` under `out_dir`; the files written."""
    plt = _mpl()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    written.append(_timeline(plt, results, out / "timeline.png", title))
    span = _waiting_span(results)
    if span is not None:
        written.append(_timeline(plt, results, out / "timeline_waiting.png", title, xlim=span))

    for kind in ("wait", "jct"):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for k, r in enumerate(results):
            vals = [j.wait if kind == "wait" else j.jct for j in r.jobs]
            _cdf(ax, [v for v in vals if v is not None], r.policy, _style(k))
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
        for k, q in enumerate(busiest):
            qs = [j for j in r.jobs if j.queue == q]
            _cdf(aw, [j.wait for j in qs if j.wait is not None], f"{q} ({counts[q]})", _style(k))
            _cdf(aj, [j.jct for j in qs if j.jct is not None], f"{q} ({counts[q]})", _style(k))
        for ax, what in ((aw, "queueing delay"), (aj, "JCT")):
            ax.set_xscale("log")
            ax.set_xlabel(f"{what} (s)")
            ax.set_ylabel("fraction of jobs")
            ax.legend(fontsize=7)
        fig.suptitle(f"{title}: {r.policy}, per queue")
        fig.tight_layout()
        written.append(out / f"cdf_by_queue_{r.policy.replace(':', '-')}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
