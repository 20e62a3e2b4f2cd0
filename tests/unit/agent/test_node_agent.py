"""The node agent against a recording bus (no broker): registration, heartbeats, grants, gang
restarts across nodes, preemption checkpoints, releases, health and crashes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from agent_node_fakes import (
    FakeBus,
    admitted,
    envelope,
    grant,
    make_agent,
    preempting,
    released,
    wait_for,
)

from gangline.agent.node import derived_id
from gangline.agent.simulated import PROGRESS_FILE, PlannedFailure, SimulatedRunner
from gangline.events.allocations import AllocationGranted, AllocationReleased, MigSlice, Placement
from gangline.events.jobs import (
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobResizing,
    JobStarted,
    WorkerExited,
)
from gangline.events.nodes import GpuHealthChanged, NodeHeartbeat, NodeRegistered

LONG_S = 100_000  # x 0.001 time scale: runs until told otherwise within any test


async def test_registers_first_then_heartbeats_with_increasing_seq(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus)
    await agent.start()
    try:
        await wait_for(lambda: len(bus.of(NodeHeartbeat)) >= 3, "three heartbeats")
        first = bus.sent[0]
        assert first[0] == "nodes.inventory"
        reg = first[1].data
        assert isinstance(reg, NodeRegistered)
        assert [g.id for g in reg.gpus] == ["gpu0", "gpu1"]
        assert (reg.node, reg.leaf, reg.spine, reg.nvlink_domain) == ("n0", "leaf-0", "spine-0", "n0")
        assert first[1].source == "gangline/agent/n0" and first[1].subject == "n0"
        beats = bus.of(NodeHeartbeat, topic="nodes.heartbeats")
        assert [b.seq for b in beats[:3]] == [0, 1, 2]
        assert all(s.healthy and not s.busy for s in beats[0].gpus)
        assert beats[0].gpus[0].temperature_c == 35
    finally:
        await agent.stop()


async def test_stop_heartbeats_silences_only_heartbeats(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus)
    await agent.start()
    try:
        await wait_for(lambda: len(bus.of(NodeHeartbeat)) >= 1, "a heartbeat")
        agent.stop_heartbeats()
        await agent.flush()
        silent_from = len(bus.of(NodeHeartbeat))
        agent.inject_xid("gpu1", 79)  # the agent is still alive: health still flows
        await wait_for(lambda: bus.of(GpuHealthChanged), "gpu.health_changed")
        await asyncio.sleep(0.3)  # six heartbeat periods
        assert len(bus.of(NodeHeartbeat)) == silent_from
        agent.resume_heartbeats()
        await wait_for(lambda: len(bus.of(NodeHeartbeat)) > silent_from, "heartbeats again")
        assert bus.of(NodeHeartbeat)[-1].gpus[1].healthy is False
    finally:
        await agent.stop()


async def test_grant_runs_the_job_and_rank0_reports_started_exits_completed(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        await agent.handle(admitted("j1", workers=2, duration_s=50))
        the_grant = grant("j1", "a1", [(0, "n0", ("gpu0",)), (1, "n0", ("gpu1",))])
        await agent.handle(the_grant)
        await wait_for(lambda: bus.of(JobCompleted), "job.completed")
        await agent.flush()
        job_events = [e.data for t, e in bus.sent if t == "jobs.events"]
        assert [type(e).__name__ for e in job_events] == [
            "JobStarted",
            "WorkerExited",
            "WorkerExited",
            "JobCompleted",
        ]
        started = bus.envelopes(JobStarted)[0]
        assert started.causationid == the_grant.id and started.id == derived_id("a1", "n0", "started")
        exits = bus.of(WorkerExited)
        assert {(e.rank, e.exit_code, e.signal, e.gpus) for e in exits} == {
            (0, 0, None, ("gpu0",)),
            (1, 0, None, ("gpu1",)),
        }
        launch = runner.launches[0]
        assert launch.duration_hint_s == 50
        assert launch.checkpoint_dir == tmp_path / "ckpt" / "j1"
        assert [r.gpus[0].startswith("GPU-") for r in launch.ranks] == [True, True]
        assert launch.rendezvous.master_addr == "127.0.0.1" and launch.rendezvous.world_size == 2
        assert agent.jobs == {}
        (done,) = bus.of(JobCompleted)
        assert done.allocation_id == "a1" and done.gpu_seconds is not None and done.gpu_seconds >= 0
        # Placement releases the GPUs on reading the completion: an agent never writes allocations.log.
        assert [t for t, _ in bus.sent if t == "allocations.log"] == []
    finally:
        await agent.stop()


async def test_a_redelivered_or_repeated_grant_never_starts_a_second_copy(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        await agent.handle(admitted("j1", duration_s=LONG_S))
        first = grant("j1", "a1", [(0, "n0", ("gpu0",))])
        await agent.handle(first)
        await agent.handle(first)  # the same message again (redelivery)
        await agent.handle(grant("j1", "a1", [(0, "n0", ("gpu0",))]))  # a new id, the same allocation
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        assert len(runner.launches) == 1
        assert list(agent.jobs) == ["j1"]
        await agent.handle(released("j1", "a1"))
        await wait_for(lambda: not agent.jobs, "the release to stop the job")
        await agent.handle(first)  # a late duplicate after the job is gone
        assert len(runner.launches) == 1
    finally:
        await agent.stop()


async def test_grant_for_other_nodes_is_ignored(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        await agent.handle(grant("j9", "a9", [(0, "elsewhere", ("gpu0",))]))
        assert runner.launches == [] and agent.jobs == {}
    finally:
        await agent.stop()


async def test_grant_waits_for_the_spec_then_starts_with_it(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner, spec_wait_s=30.0)
    await agent.start()
    try:
        await agent.handle(grant("j2", "a2", [(0, "n0", ("gpu1",))]))
        assert runner.launches == []
        await agent.handle(admitted("j2", duration_s=7, env={"FOO": "bar"}))
        await wait_for(lambda: runner.launches, "the launch")
        assert runner.launches[0].duration_hint_s == 7
        assert dict(runner.launches[0].env) == {"FOO": "bar"}
    finally:
        await agent.stop()


async def test_grant_without_spec_starts_with_defaults_after_the_wait(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001, default_duration_s=1)
    agent = make_agent(tmp_path, bus, runner=runner, spec_wait_s=0.05)
    await agent.start()
    try:
        await agent.handle(grant("j3", "a3", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobCompleted), "job.completed")
        assert runner.launches[0].duration_hint_s is None
    finally:
        await agent.stop()


async def test_preempting_checkpoints_and_a_requeued_run_resumes_from_the_same_dir(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001, checkpoint_delay_s=0.01)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        await agent.handle(admitted("j4", duration_s=LONG_S))
        await agent.handle(grant("j4", "a4", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        await asyncio.sleep(0.05)  # some simulated progress
        ask = preempting("j4", "a4", grace_s=5.0)
        await agent.handle(ask)
        await wait_for(lambda: bus.of(JobCheckpointed), "job.checkpointed")
        ckpt = bus.envelopes(JobCheckpointed)[0]
        assert ckpt.causationid == ask.id
        assert ckpt.data.checkpoint == str(tmp_path / "ckpt" / "j4")  # type: ignore[attr-defined]
        assert ckpt.data.node == "n0"  # type: ignore[attr-defined]
        saved = json.loads((tmp_path / "ckpt" / "j4" / PROGRESS_FILE).read_text())["progress_s"]
        assert saved > 0
        assert not bus.of(JobCompleted)  # a preempted job is not complete
        await agent.handle(released("j4", "a4", "preempted"))
        await wait_for(lambda: not agent.jobs, "the job to leave")

        await agent.handle(grant("j4", "a4-again", [(0, "n0", ("gpu1",))]))  # requeued elsewhere here
        await wait_for(lambda: len(runner.launches) == 2, "the second launch")
        assert runner.launches[1].checkpoint_dir == runner.launches[0].checkpoint_dir
        await agent.handle(preempting("j4", "a4-again", grace_s=5.0))
        await wait_for(lambda: len(bus.of(JobCheckpointed)) == 2, "the second checkpoint")
        resumed = json.loads((tmp_path / "ckpt" / "j4" / PROGRESS_FILE).read_text())["progress_s"]
        assert resumed > saved  # progress carried over, not restarted from zero
    finally:
        await agent.stop()


async def test_a_resize_checkpoints_then_relaunches_the_new_size_from_the_same_dir(tmp_path: Path) -> None:
    """job.resizing is a checkpoint request; the grant that resizes the allocation, read while the old
    ranks may still be stopping, launches 2 ranks (WORLD_SIZE 2) once they have, from the checkpoint."""
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001, checkpoint_delay_s=0.01)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        await agent.handle(admitted("el", duration_s=LONG_S, min_workers=1, max_workers=2))
        await agent.handle(grant("el", "el.1", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        await asyncio.sleep(0.05)  # some simulated progress
        two = (Placement(rank=0, node="n0", gpus=("gpu0",)), Placement(rank=1, node="n0", gpus=("gpu1",)))
        ask = envelope(
            JobResizing(
                job_id="el",
                allocation_id="el.1",
                from_workers=1,
                to_workers=2,
                placements=two,
                deadline=datetime.now(UTC) + timedelta(seconds=5),
                reason="elastic el grows from 1 to 2 workers on idle GPUs",
            )
        )
        await agent.handle(ask)
        await wait_for(lambda: bus.of(JobCheckpointed), "job.checkpointed")
        assert bus.envelopes(JobCheckpointed)[0].causationid == ask.id
        await agent.handle(released("el", "el.1", "resized"))
        resized = AllocationGranted(
            job_id="el", allocation_id="el.2", queue="default", placements=two, resizes="el.1"
        )
        await agent.handle(envelope(resized))
        await wait_for(lambda: len(runner.launches) == 2, "the launch at the new size")
        launch = runner.launches[1]
        assert launch.allocation_id == "el.2" and launch.rendezvous.world_size == 2
        assert len(launch.ranks) == 2 and launch.checkpoint_dir == runner.launches[0].checkpoint_dir
        assert not bus.of(JobCompleted)
    finally:
        await agent.stop()


async def test_a_checkpoint_slower_than_the_grace_is_not_acknowledged(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001, checkpoint_delay_s=30.0)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        await agent.handle(admitted("j5", duration_s=LONG_S))
        await agent.handle(grant("j5", "a5", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        await agent.handle(preempting("j5", "a5", grace_s=0.05))
        await wait_for(lambda: bus.of(WorkerExited), "the rank to be killed")
        await wait_for(lambda: not agent.jobs, "the gang to end")
        await agent.flush()
        assert bus.of(JobCheckpointed) == []
        assert [(e.exit_code, e.signal) for e in bus.of(WorkerExited)] == [(None, 9)]
    finally:
        await agent.stop()


async def test_release_stops_the_ranks_without_reporting_an_outcome(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus)
    await agent.start()
    try:
        await agent.handle(admitted("j6", duration_s=LONG_S))
        await agent.handle(grant("j6", "a6", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        await wait_for(lambda: bus.of(NodeHeartbeat)[-1].gpus[0].busy, "gpu0 busy in a heartbeat")
        await agent.handle(released("j6", "a6", "cancelled"))
        await wait_for(lambda: not agent.jobs, "the job to stop")
        await agent.flush()
        assert bus.of(JobCompleted) == [] and bus.of(JobFailed) == []
        assert bus.of(AllocationReleased) == []  # whoever released it owns the outcome
        assert len(bus.of(WorkerExited)) == 1
        await wait_for(lambda: not bus.of(NodeHeartbeat)[-1].gpus[0].busy, "gpu0 idle again")
    finally:
        await agent.stop()


async def test_a_failed_rank_restarts_the_gang_on_every_node(tmp_path: Path) -> None:
    bus = FakeBus()
    run_a = SimulatedRunner(time_scale=0.001)
    run_b = SimulatedRunner(time_scale=0.001)
    run_b.plan_failure("g1", PlannedFailure(after_s=0.02, rank=3, exit_code=7, attempts=(0,)))
    a = make_agent(tmp_path / "a", bus, node="node-a", runner=run_a)
    b = make_agent(tmp_path / "b", bus, node="node-b", runner=run_b)
    await a.start()
    await b.start()
    try:
        spec = admitted("g1", workers=4, duration_s=300)
        the_grant = grant(
            "g1",
            "ga",
            [
                (0, "node-a", ("gpu0",)),
                (1, "node-a", ("gpu1",)),
                (2, "node-b", ("gpu0",)),
                (3, "node-b", ("gpu1",)),
            ],
        )
        for agent in (a, b):
            await agent.handle(spec)
            await agent.handle(the_grant)
        await wait_for(lambda: bus.of(JobCompleted), "job.completed after the restart")
        await a.flush()
        await b.flush()
        exits = bus.of(WorkerExited)
        failed = [e for e in exits if e.exit_code == 7]
        assert [(e.node, e.rank, e.restarts) for e in failed] == [("node-b", 3, 0)]
        torn_down = {(e.node, e.rank) for e in exits if e.restarts == 0 and e.signal == 15}
        assert torn_down == {("node-a", 0), ("node-a", 1), ("node-b", 2)}
        assert {(e.node, e.rank) for e in exits if e.restarts == 1 and e.exit_code == 0} == {
            ("node-a", 0),
            ("node-a", 1),
            ("node-b", 2),
            ("node-b", 3),
        }
        assert len(bus.of(JobStarted)) == 1 and len(bus.of(JobCompleted)) == 1  # rank 0's node only
        assert bus.envelopes(JobCompleted)[0].source == "gangline/agent/node-a"
        port = {r.rendezvous.master_port for r in run_a.launches + run_b.launches}
        assert len(port) == 1
    finally:
        await a.stop()
        await b.stop()


async def test_rank0_reports_job_failed_when_the_policy_gives_up(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    runner.plan_failure("j7", PlannedFailure(after_s=0.0, exit_code=3, attempts=(0, 1, 2)))
    agent = make_agent(tmp_path, bus, runner=runner, max_restarts=1)
    await agent.start()
    try:
        await agent.handle(admitted("j7", duration_s=LONG_S))
        await agent.handle(grant("j7", "a7", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobFailed), "job.failed")
        failed = bus.of(JobFailed)[0]
        assert (failed.code, failed.exit_code, failed.allocation_id) == ("restarts_exhausted", 3, "a7")
        assert [e.restarts for e in bus.of(WorkerExited)] == [0, 1]
        assert failed.gpu_seconds is not None  # what placement's release will say the gang held
        assert bus.of(AllocationReleased) == []  # placement releases it on reading job.failed
    finally:
        await agent.stop()


async def test_xid_79_fails_the_gpu_and_the_simulated_rank_on_it(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus, restart_policy="never")
    await agent.start()
    try:
        await agent.handle(admitted("j8", duration_s=LONG_S))
        await agent.handle(grant("j8", "a8", [(0, "n0", ("gpu1",))]))
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        agent.inject_xid("gpu1", 79)
        await wait_for(lambda: bus.of(GpuHealthChanged), "gpu.health_changed")
        await wait_for(lambda: bus.of(JobFailed), "job.failed")
        changed = bus.of(GpuHealthChanged, topic="nodes.health")[0]
        assert (changed.node, changed.gpu, changed.previous, changed.state) == (
            "n0",
            "gpu1",
            "healthy",
            "failed",
        )
        assert changed.cause.kind in ("xid", "lost")
        assert bus.of(JobFailed)[0].code == "worker_exit"
        assert agent.health == {"gpu0": "healthy", "gpu1": "failed"}
    finally:
        await agent.stop()


async def test_a_watch_xid_changes_nothing_and_a_drain_xid_degrades(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus)
    await agent.start()
    try:
        agent.inject_xid(0, 92)  # high single-bit rate: watch only
        agent.inject_xid("gpu0", 94)  # contained uncorrectable ECC: drain
        await wait_for(lambda: bus.of(GpuHealthChanged), "gpu.health_changed")
        await agent.flush()
        changes = bus.of(GpuHealthChanged)
        assert [(c.gpu, c.state, c.cause.kind, c.cause.xid) for c in changes] == [
            ("gpu0", "degraded", "xid", 94)
        ]
    finally:
        await agent.stop()


async def test_crash_kills_ranks_and_publishes_nothing_more(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    await agent.handle(admitted("j9", duration_s=LONG_S))
    await agent.handle(grant("j9", "a9", [(0, "n0", ("gpu0",))]))
    await wait_for(lambda: bus.of(JobStarted), "job.started")
    await agent.flush()
    before = len(bus.sent)
    await agent.crash()
    assert runner.running() == {}
    await asyncio.sleep(0.2)  # four heartbeat periods
    assert len(bus.sent) == before
    await agent.handle(grant("j10", "a10", [(0, "n0", ("gpu0",))]))
    assert len(runner.launches) == 1


async def test_graceful_stop_stops_running_ranks(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    await agent.handle(admitted("j11", duration_s=LONG_S))
    await agent.handle(grant("j11", "a11", [(0, "n0", ("gpu0",))]))
    await wait_for(lambda: bus.of(JobStarted), "job.started")
    await agent.stop()
    assert runner.running() == {}
    assert [(e.exit_code, e.signal) for e in bus.of(WorkerExited)] == [(0, None)]  # checkpointed and left
    assert bus.of(JobCompleted) == [] and bus.of(JobCheckpointed) == []


async def test_serve_runs_until_cancelled_then_stops_the_ranks(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner)
    serving = asyncio.create_task(agent.serve())
    await wait_for(lambda: bus.of(NodeHeartbeat), "a heartbeat")
    await agent.handle(admitted("j12", duration_s=LONG_S))
    await agent.handle(grant("j12", "a12", [(0, "n0", ("gpu1",))]))
    await wait_for(lambda: bus.of(JobStarted), "job.started")
    serving.cancel()  # what run_service does on SIGTERM
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert runner.running() == {}
    assert [(e.rank, e.exit_code) for e in bus.of(WorkerExited)] == [(0, 0)]


async def test_mig_placements_see_their_slice_uuids(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner, spec="dgx-a100-mig")
    await agent.start()
    try:
        slices = (
            Placement(
                rank=0, node="n0", gpus=("gpu1",), mig=MigSlice(gpu="gpu1", profile="2g.20gb", instance_id=5)
            ),
            Placement(rank=1, node="n0", gpus=("gpu0",), mig=MigSlice(gpu="gpu0", profile="1g.10gb")),
            Placement(rank=2, node="n0", gpus=("gpu0",), mig=MigSlice(gpu="gpu0", profile="1g.10gb")),
        )
        await agent.handle(admitted("m1", workers=3, duration_s=LONG_S))
        await agent.handle(
            envelope(AllocationGranted(job_id="m1", allocation_id="am1", queue="default", placements=slices))
        )
        await wait_for(lambda: runner.launches, "the launch")
        migs = {
            str(g.id): {(m.profile, m.instance_id): m.uuid for m in g.mig_instances}
            for g in agent.registration.gpus
        }
        visible = [r.gpus for r in runner.launches[0].ranks]
        assert visible[0] == (migs["gpu1"][("2g.20gb", 5)],)
        assert visible[1] != visible[2]
        assert {visible[1][0], visible[2][0]} <= set(migs["gpu0"].values())
    finally:
        await agent.stop()


async def test_a_slice_named_by_nvml_ids_or_by_its_start_launches_on_that_mig_device(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner, spec="dgx-a100-mig")
    await agent.start()
    try:
        slices = (
            # GPU instance 7 sits at memory slice 4 on gpu0 (the spec's driver ids are not starts)
            Placement(
                rank=0,
                node="n0",
                gpus=("gpu0",),
                mig=MigSlice(gpu="gpu0", profile="1g.10gb", instance_id=7, compute_instance_id=0, start=4),
            ),
            # no ids (a node that did not say them): the device at that start
            Placement(
                rank=1, node="n0", gpus=("gpu0",), mig=MigSlice(gpu="gpu0", profile="1g.10gb", start=0)
            ),
        )
        await agent.handle(admitted("m2", workers=2, duration_s=LONG_S))
        await agent.handle(
            envelope(AllocationGranted(job_id="m2", allocation_id="am2", queue="default", placements=slices))
        )
        await wait_for(lambda: runner.launches, "the launch")
        by_instance = {m.instance_id: m.uuid for m in agent.registration.gpus[0].mig_instances}
        by_start = {m.placement_start: m.uuid for m in agent.registration.gpus[0].mig_instances}
        visible = [r.gpus for r in runner.launches[0].ranks]
        assert visible == [(by_instance[7],), (by_start[0],)]
        assert by_instance[7] == by_start[4] and by_start[0] == by_instance[10]
        assert all(v[0].startswith("MIG-") for v in visible)
    finally:
        await agent.stop()


async def test_a_slice_naming_a_gpu_instance_the_node_lacks_fails_at_launch(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner, spec="dgx-a100-mig")
    await agent.start()
    try:
        missing = MigSlice(gpu="gpu1", profile="1g.10gb", instance_id=9, compute_instance_id=0, start=3)
        await agent.handle(admitted("m3"))
        await agent.handle(
            envelope(
                AllocationGranted(
                    job_id="m3",
                    allocation_id="am3",
                    queue="default",
                    placements=(Placement(rank=0, node="n0", gpus=("gpu1",), mig=missing),),
                )
            )
        )
        await wait_for(lambda: bus.of(JobFailed), "job.failed")
        [failed] = bus.of(JobFailed)
        assert failed.code == "launch_failed" and "GPU instance 9" in failed.reason
        assert runner.launches == []
    finally:
        await agent.stop()


async def test_a_grant_naming_an_unknown_gpu_fails_at_launch(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        await agent.handle(admitted("u1"))
        await agent.handle(grant("u1", "au1", [(0, "n0", ("gpu7",))]))
        await wait_for(lambda: bus.of(JobFailed), "job.failed")
        assert bus.of(JobFailed)[0].code == "launch_failed" and "gpu7" in bus.of(JobFailed)[0].reason
        assert runner.launches == []
        assert bus.of(AllocationReleased) == []  # placement releases it on reading job.failed
    finally:
        await agent.stop()


async def test_exits_during_a_gang_wide_preemption_do_not_restart_the_peers(tmp_path: Path) -> None:
    bus = FakeBus()
    runners = [SimulatedRunner(time_scale=0.001, checkpoint_delay_s=30.0) for _ in range(2)]
    a = make_agent(tmp_path / "a", bus, node="node-a", runner=runners[0])
    b = make_agent(tmp_path / "b", bus, node="node-b", runner=runners[1])
    await a.start()
    await b.start()
    try:
        spec = admitted("g2", workers=2, duration_s=LONG_S)
        the_grant = grant("g2", "g2a", [(0, "node-a", ("gpu0",)), (1, "node-b", ("gpu0",))])
        ask = preempting("g2", "g2a", grace_s=0.05)  # too short: ranks are killed, not checkpointed
        for agent in (a, b):
            await agent.handle(spec)
            await agent.handle(the_grant)
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        for agent in (a, b):
            await agent.handle(ask)
        await wait_for(lambda: not a.jobs and not b.jobs, "both nodes to stop")
        await a.flush()
        await b.flush()
        assert sorted((e.node, e.signal, e.restarts) for e in bus.of(WorkerExited)) == [
            ("node-a", 9, 0),
            ("node-b", 9, 0),
        ]
        assert len(runners[0].launches) == len(runners[1].launches) == 1
        assert bus.of(JobFailed) == [] and bus.of(JobCheckpointed) == []
    finally:
        await a.stop()
        await b.stop()


async def test_a_simulated_job_is_stopped_at_its_scaled_time_limit(tmp_path: Path) -> None:
    bus = FakeBus()
    runner = SimulatedRunner(time_scale=0.001, checkpoint_delay_s=0.01)
    agent = make_agent(tmp_path, bus, runner=runner)
    await agent.start()
    try:
        # 100 s of job time is 0.1 s here; its hint says it would run far longer.
        await agent.handle(admitted("t1", duration_s=100_000, time_limit_s=100))
        await agent.handle(grant("t1", "ta1", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobFailed), "job.failed at the limit")
        [failed] = bus.of(JobFailed)
        assert failed.code == "time_limit" and "100 s" in failed.reason
        assert len(bus.of(JobCheckpointed)) == 1 and bus.of(JobCompleted) == []
    finally:
        await agent.stop()
