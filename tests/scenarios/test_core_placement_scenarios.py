"""Placement scenarios for the scheduling core: clusters in, jobs in, decisions out."""

from __future__ import annotations

from scenarios.dsl import build_snapshot, fabric, gpus, held, job, scenario

from gangline.core.framework.status import ReasonCode, StatusCode
from gangline.core.model import JobId


def test_small_job_fits_on_the_only_node() -> None:
    scenario(nodes={"n0": gpus(8)}, jobs=[job("j1", gpus=4)]).expect(placed={"j1": "n0"})


def test_32_gpu_gang_fits_only_across_four_nodes_of_one_leaf() -> None:
    # leaf A: 4 empty nodes (32 GPUs); leaf B: 4 nodes with 6 free each (24 GPUs); 56 free in all
    nodes = {f"a{k}": gpus(8, leaf="A") for k in range(4)} | {f"b{k}": gpus(8, leaf="B") for k in range(4)}
    busy = [held(job(f"r{k}", gpus=2), {f"b{k}": 2}) for k in range(4)]
    s = scenario(nodes=nodes, running=busy, jobs=[job("big", gpus=8, workers=4, topology="leaf")])
    s.expect(placed={"big": {"a0", "a1", "a2", "a3"}})
    ranks = s.plan.placed[0].allocation.placements
    assert [len(p.gpus) for p in ranks] == [8, 8, 8, 8]
    assert s.plan.placed[0].reasons[0].code is ReasonCode.PLACED


def test_32_gpu_gang_spanning_two_leaves_is_refused_when_leaf_is_required() -> None:
    nodes = {f"a{k}": gpus(8, leaf="A") for k in range(2)} | {f"b{k}": gpus(8, leaf="B") for k in range(2)}
    s = scenario(nodes=nodes, jobs=[job("big", gpus=8, workers=4, topology="leaf")])
    s.expect(pending=["big"])
    assert ReasonCode.TOPOLOGY in s.codes("big")
    assert s.plan.pending_job(JobId("big")).code is StatusCode.UNRESOLVABLE


def test_required_nvlink_8_gpu_job_refused_when_8_free_gpus_are_split_over_two_nodes() -> None:
    nodes = {"n0": gpus(8), "n1": gpus(8)}
    busy = [held(job("r0", gpus=4), {"n0": 4}), held(job("r1", gpus=4), {"n1": 4})]
    s = scenario(nodes=nodes, running=busy, jobs=[job("j8", gpus=8, topology="nvlink")])
    s.expect(pending=["j8"])
    frag = [r for r in s.reasons("j8") if r.code is ReasonCode.FRAGMENTATION]
    assert frag, s.reasons("j8")
    assert frag[0].message == "8 GPUs free, none 8 in one NVLink domain (largest free: 4)"
    assert frag[0].details["largest_free_domain"] == 4


def test_without_topology_an_8_gpu_worker_still_needs_one_node() -> None:
    nodes = {"n0": gpus(8), "n1": gpus(8)}
    busy = [held(job("r0", gpus=4), {"n0": 4}), held(job("r1", gpus=4), {"n1": 4})]
    s = scenario(nodes=nodes, running=busy, jobs=[job("j8", gpus=8)])
    s.expect(pending=["j8"])
    assert ReasonCode.FRAGMENTATION in s.codes("j8")
    assert any("none 8 on one node" in r.message for r in s.reasons("j8"))


def test_two_gangs_that_cannot_both_fit_never_deadlock() -> None:
    # 16 GPUs; two 12-GPU gangs: a partial placement of both would deadlock
    nodes = {f"n{k}": gpus(4) for k in range(4)}
    s = scenario(nodes=nodes, jobs=[job("g1", gpus=4, workers=3), job("g2", gpus=4, workers=3)])
    s.expect(placed=["g1"], pending=["g2"])
    assert len(s.plan.placed[0].allocation.placements) == 3
    assert ReasonCode.CAPACITY in s.codes("g2")


def test_gang_that_does_not_fit_leaves_room_for_the_next_job() -> None:
    nodes = {"n0": gpus(8), "n1": gpus(8)}
    s = scenario(nodes=nodes, jobs=[job("huge", gpus=8, workers=3), job("small", gpus=8)])
    s.expect(placed=["small"], pending=["huge"])
    assert s.plan.pending_job(JobId("huge")).code is StatusCode.UNRESOLVABLE


def test_small_jobs_fill_busy_nodes_and_keep_empty_ones_whole() -> None:
    nodes = {"n0": gpus(8), "n1": gpus(8), "n2": gpus(8)}
    busy = [held(job("r1", gpus=5), {"n1": 5})]
    s = scenario(nodes=nodes, running=busy, jobs=[job("a", gpus=2), job("b", gpus=1), job("c", gpus=8)])
    s.expect(placed={"a": "n1", "b": "n1", "c": "n0"})


def test_small_jobs_prefer_the_fuller_leaf() -> None:
    nodes = {
        "a0": gpus(8, leaf="A"),
        "a1": gpus(8, leaf="A"),
        "b0": gpus(8, leaf="B"),
        "b1": gpus(8, leaf="B"),
    }
    busy = [
        held(job("r1", gpus=4), {"b0": 4}),
        held(job("r2", gpus=4), {"a0": 4}),
        held(job("r3", gpus=8), {"a1": 8}),
    ]
    s = scenario(nodes=nodes, running=busy, jobs=[job("x", gpus=2)])
    s.expect(placed={"x": "a0"})


def test_preferred_topology_keeps_ranks_in_one_leaf_when_possible() -> None:
    nodes = fabric(spines=1, leaves_per_spine=2, nodes_per_leaf=2, gpus_per_node=4)
    busy = [held(job("r", gpus=4), {"n0-0-0": 4})]
    s = scenario(nodes=nodes, running=busy, jobs=[job("p", gpus=4, workers=2, topology="leaf:preferred")])
    s.expect(placed={"p": {"n0-1-0", "n0-1-1"}})


def test_preferred_topology_spills_over_when_no_leaf_can_hold_the_gang() -> None:
    nodes = fabric(spines=1, leaves_per_spine=2, nodes_per_leaf=2, gpus_per_node=4)
    busy = [held(job("r", gpus=4), {"n0-0-0": 4}), held(job("q", gpus=4), {"n0-1-0": 4})]
    s = scenario(nodes=nodes, running=busy, jobs=[job("p", gpus=4, workers=2, topology="leaf:preferred")])
    s.expect(placed={"p": {"n0-0-1", "n0-1-1"}})
    assert s.plan.placed[0].reasons[1].details["topology"] == 30  # one spine, not one leaf


def test_gpu_type_and_memory_are_matched() -> None:
    nodes = {"a": gpus(8, model="A100-40GB"), "h": gpus(8, model="H200-141GB")}
    s = scenario(
        nodes=nodes,
        jobs=[
            job("any-big", gpus=2, memory_mib=100_000),
            job("typed", gpus=2, gpu_type="A100-40GB"),
            job("missing", gpus=1, gpu_type="B200"),
            job("too-big", gpus=1, gpu_type="A100-40GB", memory_mib=80_000),
        ],
    )
    s.expect(placed={"any-big": "h", "typed": "a"}, pending=["missing", "too-big"])
    assert s.codes("missing") == {ReasonCode.GPU_TYPE}
    assert s.codes("too-big") == {ReasonCode.MEMORY}


def test_cordoned_nodes_and_unhealthy_gpus_are_skipped_with_a_reason() -> None:
    nodes = {"bad": gpus(8, cordoned=True), "sick": gpus(8, unhealthy=[0, 1, 2, 3, 4]), "ok": gpus(4)}
    s = scenario(nodes=nodes, jobs=[job("four", gpus=4), job("more", gpus=4, workers=2)])
    s.expect(placed={"four": "ok"}, pending=["more"])
    assert ReasonCode.HEALTH in s.codes("more")
    snap = s.snapshot
    assert snap.total_free[0] == 3 + 4  # sick's 3 healthy + ok's 4; nothing from the cordoned node


def test_elastic_job_takes_as_many_workers_as_fit_between_min_and_max() -> None:
    nodes = {"n0": gpus(8), "n1": gpus(8)}
    busy = [held(job("r", gpus=4), {"n0": 4})]
    s = scenario(nodes=nodes, running=busy, jobs=[job("e", gpus=4, workers=4, min_workers=2)])
    assert len(s.nodes_of("e")) == 3
    s2 = scenario(nodes=nodes, running=busy, jobs=[job("e", gpus=4, workers=8, min_workers=4)])
    s2.expect(pending=["e"])


def test_mig_slices_only_at_valid_positions() -> None:
    nodes = {"m0": gpus(1, model="A100-40GB", mode="mig")}
    jobs = [job("a", mig="3g.20gb"), job("b", mig="3g.20gb"), job("c", mig="1g.5gb")]
    s = scenario(nodes=nodes, jobs=jobs)
    s.expect(placed=["a", "b"], pending=["c"])
    starts = sorted(p.allocation.placements[0].mig.start for p in s.plan.placed)
    assert starts == [0, 4]
    assert ReasonCode.MIG_PROFILE in s.codes("c") or ReasonCode.GANG_SIZE in s.codes("c")


def test_mig_small_slice_keeps_big_profile_placeable() -> None:
    nodes = {"m0": gpus(1, model="A100-40GB", mode="mig")}
    s = scenario(nodes=nodes, jobs=[job("small", mig="1g.5gb"), job("big", mig="4g.20gb")])
    s.expect(placed=["small", "big"])
    small = s.plan.placed_job(JobId("small")).allocation.placements[0].mig
    big = s.plan.placed_job(JobId("big")).allocation.placements[0].mig
    assert small is not None and small.start >= 4
    assert big is not None and big.start == 0


def test_mig_2g_positions_and_unknown_profile() -> None:
    nodes = {"m0": gpus(1, model="H100-80GB", mode="mig")}
    jobs = [job(f"j{k}", mig="2g.20gb") for k in range(4)] + [job("x", mig="3g.20gb")]
    s = scenario(nodes=nodes, jobs=jobs)
    starts = sorted(p.allocation.placements[0].mig.start for p in s.plan.placed)
    assert starts == [0, 2, 4]
    s.expect(pending=["j3", "x"])
    assert s.codes("x") == {ReasonCode.MIG_PROFILE}


def test_fractional_jobs_share_a_gpu_up_to_1000_milli() -> None:
    nodes = {"s0": gpus(1, mode="shared")}
    s = scenario(nodes=nodes, jobs=[job("a", milli=460), job("b", milli=500), job("c", milli=100)])
    s.expect(placed=["a", "b"], pending=["c"])
    assert s.plan.placed[0].allocation.placements[0].milli == 460


def test_whole_gpu_jobs_never_take_mig_or_shared_gpus() -> None:
    nodes = {"m": gpus(8, model="A100-40GB", mode="mig"), "s": gpus(8, mode="shared")}
    s = scenario(nodes=nodes, jobs=[job("w", gpus=1)])
    s.expect(pending=["w"])
    assert ReasonCode.GPU_TYPE in s.codes("w")


def test_nvl72_rack_is_one_nvlink_domain_across_nodes() -> None:
    rack = {f"r{k}": gpus(4, nvlink="nvl72-a", leaf="L") for k in range(18)}
    other = {f"o{k}": gpus(4, leaf="L") for k in range(4)}
    s = scenario(nodes=rack | other, jobs=[job("tp", gpus=4, workers=16, topology="nvlink")])
    assert set(s.nodes_of("tp")) <= set(rack)


def test_plan_does_not_change_the_snapshot_and_commits_on_request() -> None:
    from gangline.core.framework.cycle import apply_plan

    s = scenario(nodes={"n0": gpus(8)}, jobs=[job("j1", gpus=4)])
    before = s.snapshot.total_free[0]
    plan = s.plan
    assert s.snapshot.total_free[0] == before
    assert not s.snapshot.running
    assert apply_plan(s.snapshot, plan) == []
    assert s.snapshot.total_free[0] == before - 4
    assert s.snapshot.check_invariants() == []


def test_grant_of_a_taken_gpu_is_refused_as_a_value() -> None:
    snap = build_snapshot({"n0": gpus(2)}, [held(job("a", gpus=1), {"n0": [0]})])
    from gangline.core.model import Allocation, AllocationId, GpuId, NodeId, WorkerPlacement

    alloc = Allocation(AllocationId("x"), JobId("b"), (WorkerPlacement(0, NodeId("n0"), (GpuId("n0-g0"),)),))
    st = snap.grant(job("b"), alloc)
    assert not st.ok and "held by a" in st.message
    assert snap.check_invariants() == []
