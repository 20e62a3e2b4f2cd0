"""The simulator on a tiny trace with known answers, for each policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.core.defaults import default_profile
from gangline.sim.cluster import load_cluster_spec
from gangline.sim.metrics import RunResult, summarize
from gangline.sim.run import PolicyRun, run_campaign
from gangline.sim.trace import load_trace

HERE = Path(__file__).parent


def _run(policy: str) -> RunResult:
    jobs = load_trace(HERE / "tiny_trace.csv")
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    run = PolicyRun(policy, default_profile()) if policy == "default" else PolicyRun(policy)
    (result,) = run_campaign(jobs, spec, [run])
    return result


@pytest.mark.parametrize("policy", ["k8s-first-fit", "fifo-gang-best-fit", "default"])
def test_known_waits_and_jcts(policy: str) -> None:
    # 2 nodes x 8 GPUs. big-a (8) and half-b (4) start at 0; gang-a (2x8) waits for both nodes;
    # late-b (4) fits next to half-b at 20; both b jobs end at 50, big-a at 100: gang-a starts at 100.
    r = _run(policy)
    rec = {j.id: j for j in r.jobs}
    assert {k: (v.start, v.end) for k, v in rec.items()} == {
        "big-a": (0.0, 100.0),
        "half-b": (0.0, 50.0),
        "gang-a": (100.0, 200.0),
        "late-b": (20.0, 50.0),
    }
    s = summarize(r)
    assert s["mean_wait_s"] == pytest.approx(22.5)
    assert s["p99_wait_s"] == pytest.approx(90.0)
    assert s["mean_jct_s"] == pytest.approx((100 + 50 + 190 + 30) / 4)
    assert s["makespan_s"] == pytest.approx(200.0)
    assert s["utilization"] == pytest.approx((8 * 100 + 4 * 50 + 16 * 100 + 4 * 30) / (16 * 200))
    assert s["unfinished"] == 0


def test_pod_baseline_holds_a_partial_gang_and_the_core_never_does() -> None:
    # At 50 node n-0001 is empty: the pod baseline binds gang-a's first pod there and holds 8 GPUs
    # idle until big-a ends at 100; the core places gang-a whole, at 100, or not at all.
    pods = summarize(_run("k8s-first-fit"))
    assert pods["partial_gangs"] == 1
    assert pods["partial_gpu_hours"] == pytest.approx(8 * 50 / 3600)
    alloc, util = pods["allocation"], pods["utilization"]
    assert isinstance(alloc, float) and isinstance(util, float) and alloc > util
    for policy in ("fifo-gang-best-fit", "default"):
        s = summarize(_run(policy))
        assert s["partial_gangs"] == 0
        assert s["partial_gpu_hours"] == 0
        assert s["allocation"] == pytest.approx(s["utilization"])


def test_series_follows_the_waiting_queue() -> None:
    r = _run("fifo-gang-best-fit")
    waiting = dict(zip(r.series.t, r.series.waiting, strict=True))
    assert waiting[10.0] == 1  # gang-a waits from 10
    assert waiting[100.0] == 0
    assert max(r.series.running) == 16
