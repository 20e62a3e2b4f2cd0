"""Unit tests of the core's model, MIG geometry, snapshot transactions, profile and framework."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from scenarios.dsl import build_snapshot, fabric, gpus, held, job

from gangline.core.defaults import DEFAULT_PROFILE_YAML, default_profile, placement_registry, profile_path
from gangline.core.framework.cycle import run_cycle
from gangline.core.framework.profile import load_profile, load_profile_file
from gangline.core.framework.registry import Registry
from gangline.core.framework.state import Candidate, CycleState
from gangline.core.framework.status import ReasonCode, Status, StatusCode
from gangline.core.mig import MIG_GEOMETRIES
from gangline.core.model import Job, JobId, QueueName, TopologyLevel
from gangline.core.snapshot import Snapshot


def test_mig_geometry_matches_the_nvidia_placement_tables() -> None:
    a100 = MIG_GEOMETRIES["A100-40GB"]
    starts = {p.name: p.starts for p in a100.profiles}
    assert starts == {
        "1g.5gb": (0, 1, 2, 3, 4, 5, 6),
        "1g.10gb": (0, 2, 4, 6),
        "2g.10gb": (0, 2, 4),
        "3g.20gb": (0, 4),
        "4g.20gb": (0,),
        "7g.40gb": (0,),
    }
    three = a100.profile("3g.20gb")
    assert three is not None and three.memory_slices == 4 and three.compute == 3
    assert three.mask_at(4) == 0b11110000
    assert {p.name for p in MIG_GEOMETRIES["H200-141GB"].profiles} == {
        "1g.18gb",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    }
    assert {p.name for p in MIG_GEOMETRIES["A100-80GB"].profiles} >= {"1g.10gb", "3g.40gb", "7g.80gb"}


LGIPP_GH100 = """
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""
"""`nvidia-smi mig -lgipp` as printed on H100 80GB and H100 NVL (driver 560, published in NVIDIA's
MIG user guide and H100 NVL material); ID 20 (`1g.*+me`, same placements as 19) is left out.
H200 (the same GH100 die) is held to the same table; its profile names are confirmed from published
MIG configurations, its placements are not from a printed H200 `-lgipp`."""

GH100_PROFILE_IDS = {
    "H100-80GB": {19: "1g.10gb", 15: "1g.20gb", 14: "2g.20gb", 9: "3g.40gb", 5: "4g.40gb", 0: "7g.80gb"},
    "H100-94GB": {19: "1g.12gb", 15: "1g.24gb", 14: "2g.24gb", 9: "3g.47gb", 5: "4g.47gb", 0: "7g.94gb"},
    "H200-141GB": {19: "1g.18gb", 15: "1g.35gb", 14: "2g.35gb", 9: "3g.71gb", 5: "4g.71gb", 0: "7g.141gb"},
}


@pytest.mark.parametrize("model", sorted(GH100_PROFILE_IDS))
def test_hopper_mig_geometry_matches_lgipp_row_by_row(model: str) -> None:
    published: dict[str, tuple[tuple[int, ...], int]] = {}
    for line in LGIPP_GH100.strip().splitlines():
        match = re.match(r"GPU\s+0 Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", line)
        assert match, line
        profile_id, starts, size = int(match[1]), match[2], int(match[3])
        name = GH100_PROFILE_IDS[model][profile_id]
        published[name] = (tuple(int(s) for s in starts.split(",")), size)
    ours = {p.name: (p.starts, p.memory_slices) for p in MIG_GEOMETRIES[model].profiles}
    assert ours == published


def test_mig_free_starts_respect_slices_and_compute_budget() -> None:
    geo = MIG_GEOMETRIES["A100-40GB"]
    four, three, one = geo.profile("4g.20gb"), geo.profile("3g.20gb"), geo.profile("1g.5gb")
    assert four and three and one
    used = four.mask_at(0)
    assert geo.free_starts(three, used, four.compute) == (4,)
    assert geo.free_starts(one, used, four.compute) == (4, 5, 6)
    used |= three.mask_at(4)
    assert geo.free_starts(one, used, 7) == ()


def test_job_construction_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Job(JobId("x"), QueueName("q"), workers=0)
    with pytest.raises(ValueError):
        job("x", mig="1g.5gb", milli=100)
    with pytest.raises(ValueError):
        job("x", workers=2, min_workers=3)


def test_transaction_undoes_everything_and_savepoints_nest() -> None:
    snap = build_snapshot(
        fabric(leaves_per_spine=2, nodes_per_leaf=2), [held(job("r", gpus=3), {"n0-0-0": 3})]
    )
    before = (snap.free[0][:], snap.g_owner[:], [b[:] for b in snap.buckets[0]], dict(snap.running))
    with snap.transaction():
        snap.release(JobId("r"))
        mark = snap.savepoint()
        snap.cordon(snap.nodes[1].id)
        snap.set_gpu_health(snap.gpus[20].id, False)
        assert snap.check_invariants() == []
        snap.rollback_to(mark)
        assert not snap.node_cordoned[1]
        assert snap.total_free[0] == 32
    assert (snap.free[0], snap.g_owner, snap.buckets[0], snap.running) == before
    assert snap.check_invariants() == []


def test_preemptible_running_counts_grants_releases_and_rollbacks() -> None:
    snap = build_snapshot(
        fabric(leaves_per_spine=2, nodes_per_leaf=2),
        [held(job("p", gpus=2, preemptible=True), {"n0-0-0": 2}), held(job("s", gpus=2), {"n0-0-1": 2})],
    )
    assert snap.preemptible_running == 1
    with snap.transaction():
        snap.release(JobId("p"))
        assert snap.preemptible_running == 0
        snap.release(JobId("s"))
        assert snap.preemptible_running == 0
    assert snap.preemptible_running == 1
    snap.release(JobId("p"))
    assert snap.preemptible_running == 0
    assert snap.check_invariants() == []


def test_domains_are_offered_tightest_first() -> None:
    snap = build_snapshot(
        fabric(leaves_per_spine=3, nodes_per_leaf=2),
        [held(job("a", gpus=8), {"n0-1-0": 8}), held(job("b", gpus=4), {"n0-2-0": 4})],
    )
    assert snap.domains_with_free(TopologyLevel.LEAF, 0, 8) == [1, 2, 0]
    assert snap.domains_with_free(TopologyLevel.LEAF, 0, 12) == [2, 0]
    assert snap.domains_with_free(TopologyLevel.LEAF, 0, 13) == [0]
    assert snap.largest_free_domain(TopologyLevel.NODE, 0) == 8


def test_plan_is_identical_whatever_the_node_input_order() -> None:
    specs = fabric(spines=2, leaves_per_spine=2, nodes_per_leaf=3)
    jobs = [
        job(f"j{k}", gpus=1 + k % 8, workers=1 + k % 3, topology="leaf" if k % 4 == 0 else None)
        for k in range(12)
    ]
    a = Snapshot.build([s.build(n) for n, s in specs.items()])
    b = Snapshot.build([s.build(n) for n, s in reversed(list(specs.items()))])
    pa = run_cycle(a, jobs, default_profile(), cycle=3)
    assert pa.canonical_json() == run_cycle(b, jobs, default_profile(), cycle=3).canonical_json()
    assert pa.placed and pa.pending


def test_deployed_default_profile_matches_the_builtin_one() -> None:
    loaded = load_profile_file(profile_path(), placement_registry())
    builtin = load_profile(DEFAULT_PROFILE_YAML, placement_registry())
    assert [p.name for p in loaded.plugins] == [p.name for p in builtin.plugins]
    assert dict(loaded.weights) == dict(builtin.weights)
    assert [a.name for a in loaded.actions] == [a.name for a in builtin.actions]
    assert [a.name for a in loaded.actions] == ["reserve", "allocate", "backfill"]
    assert [vars(a) for a in loaded.actions] == [vars(a) for a in builtin.actions]
    assert [n for _, _, n in loaded.scorers] == ["mig-packing", "gang", "topology", "binpack"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("name: x\nactions: []\n", ValueError),
        ("name: x\nactions: [allocate]\nplugins: [{name: nope}]\n", KeyError),
        ("name: x\nactions: [allocate]\nplugins: [{name: gang, weight: -1}]\n", ValueError),
        ("name: x\nactions: [allocate]\nplugins: [gang, gang]\n", ValueError),
        ("name: x\nactions: [allocate]\nsettings: {max_candidates: 0}\n", ValueError),
        ("name: x\nactions: [allocate]\nsettings: {speed: 11}\n", ValueError),
        ("- just a list\n", ValueError),
    ],
)
def test_bad_profiles_fail_at_load_time(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        load_profile(text, placement_registry())


def test_registry_refuses_a_name_twice() -> None:
    with pytest.raises(ValueError):
        placement_registry().merged(Registry({"gang": lambda args: object()}))


class HoldBigJobs:
    """A permit plugin for the test: waits on gangs over 4 GPUs, counts unreserves."""

    name = "hold-big"

    def __init__(self, args: Mapping[str, object]) -> None:
        self.unreserved: list[JobId] = []

    def reserve(self, state: CycleState, job: Job, candidate: Candidate) -> Status:
        return Status.success()

    def unreserve(self, state: CycleState, job: Job, candidate: Candidate) -> None:
        self.unreserved.append(job.id)

    def permit(self, state: CycleState, job: Job, candidate: Candidate) -> Status:
        if job.total_gpus > 4:
            return Status.wait("waiting for the reservation window", plugin=self.name)
        return Status.success()

    def job_order_key(self, job: Job) -> tuple[int | str, ...]:
        return (-job.priority,)


def test_permit_wait_and_job_order_plugins_take_part() -> None:
    registry = placement_registry().merged(Registry({HoldBigJobs.name: HoldBigJobs}))
    profile = load_profile(
        DEFAULT_PROFILE_YAML.replace("plugins:\n", "plugins:\n  - name: hold-big\n"), registry
    )
    snap = build_snapshot({"n0": gpus(16)})
    jobs = [job("low", gpus=4), job("big", gpus=8, priority=5), job("high", gpus=4, priority=9)]
    plan = run_cycle(snap, jobs, profile, cycle=1)
    assert [p.job.id for p in plan.placed] == ["high", "low"]
    waiting = plan.pending_job(JobId("big"))
    assert waiting is not None and waiting.code is StatusCode.WAIT
    assert waiting.reasons[0].code is ReasonCode.PERMIT
    hold = next(p for p in profile.plugins if isinstance(p, HoldBigJobs))
    assert hold.unreserved == [JobId("big")]
