"""Plots: thinning keeps what a reader must see, and a campaign writes its files."""

from __future__ import annotations

from pathlib import Path

from gangline.cluster_spec import load_cluster_spec
from gangline.sim.plots import MAX_POINTS, plot_campaign, thin_by_time
from gangline.sim.run import PolicyRun, run_campaign
from gangline.sim.trace import load_trace

HERE = Path(__file__).parent


def test_time_thinning_keeps_quiet_stretches_peaks_and_the_last_point() -> None:
    # A quiet first half (3 points), then a dense second half with one spike.
    xs = [0.0, 10.0, 20.0] + [50.0 + k * 50.0 / 40_000 for k in range(40_000)]
    ys = [1.0, 2.0, 3.0] + [5.0] * 40_000
    ys[20_000] = 99.0
    tx, ty = thin_by_time(xs, ys)
    assert len(tx) <= 3 * MAX_POINTS
    assert (tx[:3], ty[:3]) == ([0.0, 10.0, 20.0], [1.0, 2.0, 3.0])  # not merged into one bucket
    assert max(ty) == 99.0
    assert (tx[-1], ty[-1]) == (xs[-1], ys[-1])
    assert tx == sorted(tx)


def test_campaign_plots_are_written(tmp_path: Path) -> None:
    jobs = load_trace(HERE / "tiny_trace.csv")
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    results = run_campaign(jobs, spec, [PolicyRun("k8s-first-fit"), PolicyRun("fifo-gang-best-fit")])
    written = plot_campaign(results, tmp_path, title="tiny")
    names = {p.name for p in written}
    assert {"timeline.png", "cdf_wait.png", "cdf_jct.png", "cdf_by_queue_k8s-first-fit.png"} <= names
    assert all(p.stat().st_size > 1000 for p in written)
