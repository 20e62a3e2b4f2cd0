"""The services' simulator alone: deterministic, gangs placed, preemptions carried out, traces measured."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.sim_world import END, new_simulation, outcome, simulate_world

from gangline.cluster_spec import ClusterSpec, NodeGroup, load_cluster_spec
from gangline.core.model import JobId, QueueName
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.codec import encode
from gangline.events.jobs import JobCheckpointed, JobPreempting, JobQueued, JobRequeued
from gangline.events.nodes import NodeFailed, NodeHeartbeat
from gangline.sim.metrics import summarize
from gangline.sim.trace import TraceJob, load_trace
from services.common.queues import QueuesFile, queues_of
from services.tools.simulate import (
    NodeOptions,
    ServiceOptions,
    ServiceSimulation,
    registrations,
    request_of,
    simulate_services,
    unlimited_queues,
)
from services.tools.simulate.__main__ import main

SIM = Path(__file__).resolve().parents[1] / "sim"


def wire(sim: ServiceSimulation) -> list[tuple[str, float, str]]:
    return [(tx.source, tx.at, encode(e).decode()) for tx in sim.log for _, e in tx.outputs]


def test_the_same_inputs_give_the_same_log() -> None:
    first, second = wire(simulate_world()), wire(simulate_world())
    assert len(first) > 100
    assert first == second


def test_a_gang_is_placed_whole_and_again_after_its_node_fails() -> None:
    sim = simulate_world()
    grants = [e.data for e in sim.envelopes(sim.topics.allocations) if isinstance(e.data, AllocationGranted)]
    gang = [g for g in grants if g.job_id == "b-1"]
    assert [g.allocation_id for g in gang] == ["b-1.1", "b-1.2"]
    failed = {e.data.node for e in sim.envelopes(sim.topics.health) if isinstance(e.data, NodeFailed)}
    assert len(failed) == 1
    for g in gang:
        assert sorted(p.rank for p in g.placements) == [0, 1]
        assert len({p.node for p in g.placements}) == 2
        assert all(len(p.gpus) == 8 for p in g.placements)
    assert failed & {p.node for p in gang[0].placements}
    assert not failed & {p.node for p in gang[1].placements}


def test_a_reclaim_is_carried_out_with_the_checkpoint_protocol() -> None:
    sim = simulate_world()
    kinds = [
        (type(e.data).__name__, e.data.job_id)  # type: ignore[union-attr]
        for e in sim.envelopes()
        if isinstance(e.data, JobPreempting | JobCheckpointed | AllocationReleased | JobRequeued | JobQueued)
        and e.data.job_id in ("b-2", "a-1")
    ]
    assert kinds == [
        ("JobQueued", "b-2"),
        ("JobPreempting", "b-2"),
        ("JobCheckpointed", "b-2"),
        ("AllocationReleased", "b-2"),
        ("JobRequeued", "b-2"),
        ("JobQueued", "a-1"),
    ]
    preempting = next(e.data for e in sim.envelopes() if isinstance(e.data, JobPreempting))
    assert preempting.preemptor_job_id == "a-1"
    assert outcome(sim.envelopes()).pending["b-2"] == (("gangline/quota", ("quota",)),)


def test_heartbeats_only_when_needed_decide_the_same() -> None:
    always = simulate_world()
    sparse = new_simulation()
    sparse.heartbeats = "when_needed"
    simulate_world(sparse)
    beats = [e for e in sparse.envelopes() if isinstance(e.data, NodeHeartbeat)]
    assert 0 < len(beats) < len([e for e in always.envelopes() if isinstance(e.data, NodeHeartbeat)])
    assert outcome(sparse.envelopes()) == outcome(always.envelopes())
    assert sparse.now == END


def test_a_trace_is_measured_as_gangline_simulate_measures() -> None:
    spec = load_cluster_spec(SIM / "tiny_cluster.yaml")
    jobs = load_trace(SIM / "tiny_trace.csv")
    run = simulate_services(jobs, spec, queues=SIM / "tiny_queues.yaml")
    figures = summarize(run.result)
    assert figures["jobs"] == len(jobs) == figures["completed"]
    assert figures["partial_gangs"] == 0
    assert run.rejected == 0
    waits = {j.id: j.wait for j in run.result.jobs}
    assert waits["big-a"] == 0 and waits["half-b"] == 0
    assert waits["gang-a"] is not None and waits["gang-a"] > 0  # 16 GPUs: after big-a and half-b end
    again = summarize(simulate_services(jobs, spec, queues=SIM / "tiny_queues.yaml").result)
    assert {k: v for k, v in again.items() if k != "sim_wall_s"} == {
        k: v for k, v in figures.items() if k != "sim_wall_s"
    }


def test_the_spec_becomes_registrations_and_queues() -> None:
    spec = load_cluster_spec(SIM / "tiny_cluster.yaml")
    nodes = registrations(spec)
    assert nodes == spec.registrations()  # what fake-nodes registers for the same file
    assert [n.node for n in nodes] == ["n-0", "n-1"]
    assert {n.leaf for n in nodes} == {"leaf-000"}
    assert all(len(n.gpus) == 8 and n.gpus[0].model == "A100" for n in nodes)
    queues = unlimited_queues(["team-a", "team-b", "team-z"])
    assert queues.names() == ["team-a", "team-b", "team-z"]
    assert not any(queues.limited(q) for q in queues.names())  # without a queues file nothing is limited


def test_the_command_prints_the_report(capsys: object, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code = main(
        [
            "--trace",
            str(SIM / "tiny_trace.csv"),
            "--cluster",
            str(SIM / "tiny_cluster.yaml"),
            "--queues",
            str(SIM / "tiny_queues.yaml"),
            "--report",
            str(report),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "services:default" in out and "| team-a |" in out
    assert json.loads(report.read_text())["runs"][0]["completed"] == 4


def test_a_failed_node_requeues_its_jobs_and_loses_their_work() -> None:
    spec = load_cluster_spec(SIM / "tiny_cluster.yaml")
    jobs = load_trace(SIM / "tiny_trace.csv")
    run = simulate_services(jobs, spec, failures=[(5.0, "n-0")], keep_log=True)
    sim = run.simulation
    hit = {
        e.data.job_id
        for tx in sim.log
        if tx.at < 5.0
        for _, e in tx.outputs
        if isinstance(e.data, AllocationGranted) and any(p.node == "n-0" for p in e.data.placements)
    }
    assert hit
    records = {j.id: j for j in run.result.jobs}
    for job in hit:
        assert records[job].preemptions == 1
        assert records[job].lost_gpu_hours > 0
    assert records["gang-a"].start is None  # 16 GPUs: one node of 8 is left
    assert summarize(run.result)["preemptions"] == len(hit)


def test_a_queues_file_limits_the_services_to_its_queues(tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: team-b, unlimited: true}\n", encoding="utf-8")
    spec = load_cluster_spec(SIM / "tiny_cluster.yaml")
    jobs = load_trace(SIM / "tiny_trace.csv")
    run = simulate_services(jobs, spec, queues=queues)
    assert run.rejected == len([j for j in jobs if j.queue == "team-a"]) == 2
    figures = summarize(run.result)
    assert figures["completed"] == 2 and figures["unfinished"] == 2


def test_gangline_simulate_services_puts_the_services_beside_the_core_in_one_table(
    capsys: object, tmp_path: Path
) -> None:
    from services.tools.cli import main as gangline

    report = tmp_path / "r.json"
    argv = ["simulate", "--trace", str(SIM / "tiny_trace.csv"), "--cluster", str(SIM / "tiny_cluster.yaml")]
    argv += ["--queues", str(SIM / "tiny_queues.yaml")]  # the same queues file for the core and the services
    assert (
        gangline([*argv, "--services", "--baselines", "none", "--no-progress", "--report", str(report)]) == 0
    )
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "| default " in out and "| services:default " in out
    runs = {r["policy"]: r for r in json.loads(report.read_text())["runs"]}
    # On this small world the core's simulator and the services decide the same starts.
    assert runs["default"]["completed"] == runs["services:default"]["completed"] == 4
    assert runs["default"]["mean_wait_s"] == runs["services:default"]["mean_wait_s"]


def test_a_queued_job_whose_model_s_nodes_fail_is_moved_by_quota_and_placed_on_another_model() -> None:
    """Through every service: "mover" (no GPU type) is charged to H100 and waits for the one H100 node;
    that node fails, quota moves the job's charge to A100 (``job.queued`` replacing the first) and
    placement places that same attempt on the A100 node."""
    doc = {
        "queues": [
            {
                "name": "team-a",
                "quotas": {"H100-SXM5-80GB": {"nominal": 16}, "A100-SXM4-80GB": {"nominal": 8}},
            }
        ]
    }
    spec = ClusterSpec(
        name="two-models",
        groups=(
            NodeGroup(name="h", count=1, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920),
            NodeGroup(name="a", count=1, gpu_model="A100-SXM4-80GB", gpus_per_node=8, memory_mib=81920),
        ),
    )
    sim = ServiceSimulation(
        nodes=spec.registrations(),
        queues=queues_of(QueuesFile.model_validate(doc)),
        cluster_name=spec.name,
        options=ServiceOptions(silence_s=4.0),
        node_options=NodeOptions(heartbeat_s=1.0),
        heartbeats="always",
    )
    day = 86_400.0
    fill = TraceJob(JobId("fill"), 1.0, day, QueueName("team-a"), 1, 8, gpu_type="H100-SXM5-80GB")
    mover = TraceJob(JobId("mover"), 2.0, day, QueueName("team-a"), 1, 4)
    sim.register_nodes(0.0)
    sim.request(fill.submit_s, request_of(fill))
    sim.request(mover.submit_s, request_of(mover))
    sim.run(until=5.0)
    [h100] = [n.node for n in spec.registrations() if n.gpus[0].model == "H100-SXM5-80GB"]
    sim.fail_node(6.0, h100)
    sim.run(until=30.0)

    queued = [e for e in sim.envelopes(sim.topics.events) if isinstance(e.data, JobQueued)]
    moves = [e.data for e in queued if e.data.job_id == "mover"]
    assert [(q.gpu_type, q.replaces is not None) for q in moves] == [
        ("H100-SXM5-80GB", False),
        ("A100-SXM4-80GB", True),
    ]
    assert moves[1].replaces == next(e.id for e in queued if e.data.job_id == "mover")
    grants = [e.data for e in sim.envelopes(sim.topics.allocations) if isinstance(e.data, AllocationGranted)]
    [placed] = [g for g in grants if g.job_id == "mover"]
    assert placed.allocation_id == "mover.1"  # the same attempt, not a second one
    [a100] = [n.node for n in spec.registrations() if n.gpus[0].model == "A100-SXM4-80GB"]
    assert {p.node for p in placed.placements} == {a100}


def test_a_job_past_its_time_limit_is_stopped_by_the_simulated_nodes_and_fails() -> None:
    from gangline.core.model import JobId, QueueName
    from gangline.events.jobs import JobCompleted, JobFailed
    from gangline.sim.trace import TraceJob
    from services.tools.simulate import request_of

    sim = new_simulation()
    sim.register_nodes(0.0)
    job = TraceJob(
        id=JobId("limited"),
        submit_s=1.0,
        duration_s=3600.0,
        queue=QueueName("default"),
        workers=1,
        time_limit_s=60.0,
    )
    sim.request(1.0, request_of(job))
    sim.run(until=300.0)
    ends = [e for e in sim.envelopes(sim.topics.events) if isinstance(e.data, JobFailed | JobCompleted)]
    assert [(type(e.data).__name__, e.data.code) for e in ends] == [("JobFailed", "time_limit")]  # type: ignore[union-attr]
    [granted] = [e for e in sim.envelopes(sim.topics.allocations) if isinstance(e.data, AllocationGranted)]
    [released] = [
        e.data for e in sim.envelopes(sim.topics.allocations) if isinstance(e.data, AllocationReleased)
    ]
    assert released.reason == "failed"
    ran = (ends[0].time - granted.time).total_seconds()
    assert 60.0 <= ran <= 61.0  # at the limit (and the checkpoint's acknowledgement), not the hour


def test_an_operators_drain_empties_a_node_and_a_cordon_keeps_new_work_off_in_the_simulator() -> None:
    from gangline.core.model import JobId, QueueName
    from gangline.events.nodes import NodeCordoned, NodeUncordoned
    from gangline.sim.trace import TraceJob
    from services.tools.simulate import request_of

    sim = new_simulation()
    sim.heartbeats = "when_needed"  # the drain itself asks for the ticks it needs
    sim.register_nodes(0.0)
    nodes = sorted(n.node for n in sim.nodes)
    for k, node in enumerate(nodes[1:]):  # only the first node is left in service
        sim.operate(0.5 + k / 100, NodeCordoned(node=node, reason="maintenance"))

    def long_job(name: str, at: float) -> TraceJob:
        return TraceJob(id=JobId(name), submit_s=at, duration_s=3600.0, queue=QueueName("default"), workers=1,
                        gpus_per_worker=8)  # fmt: skip

    sim.request(1.0, request_of(long_job("long", 1.0)))
    sim.request(2.0, request_of(long_job("second", 2.0)))
    sim.operate(10.0, NodeCordoned(node=nodes[0], mode="drain", drain_grace_s=20, reason="psu"))
    sim.operate(100.0, NodeUncordoned(node=nodes[1]))
    sim.run(until=200.0)

    grants = [e for e in sim.envelopes(sim.topics.allocations) if isinstance(e.data, AllocationGranted)]
    first, *later = grants
    assert (first.data.job_id, first.data.placements[0].node) == ("long", nodes[0])
    asked = [e for e in sim.envelopes(sim.topics.events) if isinstance(e.data, JobPreempting)]
    assert [(e.data.job_id, e.source) for e in asked] == [("long", "gangline/node-health")]
    assert (asked[0].time - first.time).total_seconds() >= 20 - 1  # after the drain's grace, not before
    released = [
        e.data for e in sim.envelopes(sim.topics.allocations) if isinstance(e.data, AllocationReleased)
    ]
    assert [(r.job_id, r.reason) for r in released] == [("long", "preempted")]
    # Nothing new on the drained or the cordoned nodes; once nodes[1] is back, the waiting work runs there.
    assert all(g.time.timestamp() - first.time.timestamp() > 90 for g in later)
    assert {g.data.placements[0].node for g in later} == {nodes[1]}
