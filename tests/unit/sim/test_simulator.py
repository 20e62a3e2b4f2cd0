"""The simulator on a tiny trace with known answers, for each policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gangline.cluster_spec import load_cluster_spec
from gangline.core.defaults import default_profile
from gangline.core.model import QueueName
from gangline.core.queues import gpu_resource
from gangline.queues_file import QueuesFile, load_queues_file, quota_specs
from gangline.sim.metrics import RunResult, summarize
from gangline.sim.run import PolicyRun, entitlement_weights, queue_setup, run_campaign
from gangline.sim.trace import load_trace
from services.tools.cli import main

HERE = Path(__file__).parent


def _run(policy: str) -> RunResult:
    jobs = load_trace(HERE / "tiny_trace.csv")
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    run = PolicyRun(policy, default_profile()) if policy == "default" else PolicyRun(policy)
    queues = load_queues_file(HERE / "tiny_queues.yaml")
    (result,) = run_campaign(jobs, spec, [run], queues=queues)
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
    # At 50 node n-1 is empty: the pod baseline binds gang-a's first pod there and holds 8 GPUs
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


def test_a_queues_file_limits_the_queues_it_lists_and_no_other() -> None:
    jobs = load_trace(HERE / "tiny_trace.csv")
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    doc = QueuesFile.model_validate(
        {"queues": [{"name": "team-a", "cohort": "c", "quotas": {"A100": {"nominal": 8}}}]}
    )
    setup = queue_setup(doc, spec, spec.build_nodes(), jobs)
    a, b, gpu = QueueName("team-a"), QueueName("team-b"), gpu_resource("A100")
    assert setup.tree.nominal(a, gpu) == 8 and setup.tree.spec(a).cohort == "c"
    assert setup.tree.spec(b).cohort is None and setup.tree.nominal(b, gpu) >= spec.total_gpus  # not listed
    assert setup.capacity == {gpu: 16}
    assert entitlement_weights(quota_specs(doc)[0], jobs) == {a: 8.0, b: 1.0}
    assert entitlement_weights((), jobs) == {}


def test_simulate_names_a_bad_queues_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: team-a, quota: {A100: 8}}\n", encoding="utf-8")
    args = ["simulate", "--trace", str(HERE / "tiny_trace.csv"), "--cluster", str(HERE / "tiny_cluster.yaml")]
    assert main([*args, "--queues", str(queues), "--no-progress"]) == 2
    assert "quota" in capsys.readouterr().err
    report = tmp_path / "report.json"
    good = HERE / "tiny_queues.yaml"
    assert main([*args, "--queues", str(good), "--no-progress", "--report", str(report)]) == 0
    assert json.loads(report.read_text(encoding="utf-8"))["options"]["queues"] == str(good)


def test_a_run_past_its_time_limit_ends_at_the_limit_and_lets_the_next_job_start() -> None:
    from dataclasses import replace

    jobs = {j.id: j for j in load_trace(HERE / "tiny_trace.csv")}
    # big-a would hold its node for 100 s; its limit of 60 s stops it there, so gang-a starts at 60.
    jobs["big-a"] = replace(jobs["big-a"], time_limit_s=60.0)
    spec = load_cluster_spec(HERE / "tiny_cluster.yaml")
    queues = load_queues_file(HERE / "tiny_queues.yaml")
    (result,) = run_campaign(
        list(jobs.values()), spec, [PolicyRun("default", default_profile())], queues=queues
    )
    rec = {j.id: j for j in result.jobs}
    assert (rec["big-a"].start, rec["big-a"].end, rec["big-a"].timed_out) == (0.0, 60.0, True)
    assert (rec["gang-a"].start, rec["gang-a"].timed_out) == (60.0, False)
    assert not rec["half-b"].timed_out
