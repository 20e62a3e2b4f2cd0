"""Property tests of the placement invariants over random clusters and job streams."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import apply_plan, run_cycle
from gangline.core.framework.plan import Plan
from gangline.core.mig import MIG_GEOMETRIES, MigProfileName
from gangline.core.model import (
    DomainId,
    Gpu,
    GpuId,
    GpuMode,
    GpuModel,
    Job,
    JobId,
    MiB,
    Milli,
    Node,
    NodeId,
    QueueName,
    TopologyConstraint,
    TopologyLevel,
    TopologyMode,
)
from gangline.core.snapshot import Snapshot

PROFILE = default_profile()


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    nodes: list[Node] = []
    for s in range(draw(st.integers(1, 2))):
        for lf in range(draw(st.integers(1, 3))):
            rack = draw(st.booleans())
            for k in range(draw(st.integers(1, 4))):
                nid = f"n{s}{lf}{k}"
                mode = draw(
                    st.sampled_from(
                        [GpuMode.WHOLE, GpuMode.WHOLE, GpuMode.WHOLE, GpuMode.MIG, GpuMode.SHARED]
                    )
                )
                model = draw(st.sampled_from(["A100-40GB", "H100-80GB"]))
                count = draw(st.sampled_from([1, 2, 4, 8]))
                sick = draw(st.sets(st.integers(0, count - 1), max_size=1))
                gpus = tuple(
                    Gpu(GpuId(f"{nid}g{i}"), i, GpuModel(model), MiB(40960), i not in sick, mode)
                    for i in range(count)
                )
                nodes.append(
                    Node(
                        NodeId(nid),
                        gpus,
                        leaf=DomainId(f"l{s}{lf}"),
                        spine=DomainId(f"s{s}"),
                        nvlink_domain=DomainId(f"rack{s}{lf}") if rack else None,
                        cordoned=draw(st.integers(0, 9)) == 0,
                    )
                )
    return nodes


@st.composite
def job_lists(draw: st.DrawFn, prefix: str) -> list[Job]:
    jobs: list[Job] = []
    for k in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["whole", "whole", "whole", "mig", "milli"]))
        workers = draw(st.integers(1, 4))
        topo = draw(
            st.one_of(
                st.none(),
                st.builds(
                    TopologyConstraint,
                    st.sampled_from(list(TopologyLevel)),
                    st.sampled_from(list(TopologyMode)),
                ),
            )
        )
        elastic = draw(st.booleans())
        jobs.append(
            Job(
                id=JobId(f"{prefix}{k}"),
                queue=QueueName("q"),
                workers=workers,
                gpus_per_worker=draw(st.sampled_from([1, 2, 4, 8])) if kind == "whole" else 1,
                gpu_type=draw(st.sampled_from([None, GpuModel("A100-40GB")])),
                mig_profile=MigProfileName(
                    draw(st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]))
                )
                if kind == "mig"
                else None,
                gpu_milli=Milli(draw(st.integers(1, 1000))) if kind == "milli" else None,
                topology=topo,
                min_workers=draw(st.integers(1, workers)) if elastic else None,
            )
        )
    return jobs


def check_plan(snap: Snapshot, jobs: dict[JobId, Job], plan: Plan) -> None:
    """The plan against the snapshot it was made on (before commit)."""
    whole: set[GpuId] = set()
    mig: dict[GpuId, int] = defaultdict(int)
    milli: dict[GpuId, int] = defaultdict(int)
    for r in snap.running.values():  # what was held before the cycle
        for p in r.allocation.placements:
            for g in p.gpus:
                gi = snap.gpu_pos[g]
                if p.mig is not None:
                    mig[g] |= snap.g_mig_mask[gi]
                elif p.milli is not None:
                    milli[g] += p.milli
                else:
                    whole.add(g)
    for placed in plan.placed:
        job = jobs[placed.job.id]
        ps = placed.allocation.placements
        assert job.fewest_workers <= len(ps) <= job.workers, "partial gang"
        assert [p.rank for p in ps] == list(range(len(ps)))
        for p in ps:
            i = snap.node_pos[p.node]
            assert not snap.node_cordoned[i], "placed on a cordoned node"
            assert len(p.gpus) == (job.gpus_per_worker if job.kind is GpuMode.WHOLE else 1)
            for g in p.gpus:
                gi = snap.gpu_pos[g]
                gpu = snap.gpus[gi]
                assert snap.g_node[gi] == i
                assert snap.g_healthy[gi], "placed on an unhealthy GPU"
                assert job.gpu_type is None or gpu.model == job.gpu_type
                if p.mig is not None:
                    geo = MIG_GEOMETRIES[gpu.model]
                    prof = geo.profile(p.mig.profile)
                    assert prof is not None and p.mig.start in prof.starts, "invalid MIG position"
                    assert not (mig[g] & prof.mask_at(p.mig.start)), "MIG slices granted twice"
                    mig[g] |= prof.mask_at(p.mig.start)
                elif p.milli is not None:
                    milli[g] += p.milli
                    assert milli[g] <= 1000, "GPU oversubscribed"
                else:
                    assert gpu.mode is GpuMode.WHOLE
                    assert g not in whole, "GPU granted twice"
                    whole.add(g)
        topo = job.topology
        if topo is not None and topo.mode is TopologyMode.REQUIRED:
            doms = {snap.domain_of(topo.level, snap.node_pos[p.node]) for p in ps}
            assert len(doms) == 1, "required topology broken"
    assert len(whole) <= sum(snap.capacity)


def fingerprint(snap: Snapshot) -> tuple[object, ...]:
    return (
        tuple(tuple(f) for f in snap.free),
        tuple(snap.g_owner),
        tuple(snap.g_mig_mask),
        tuple(snap.g_milli_used),
        tuple(sorted(snap.running)),
        tuple(tuple(tuple(b) for b in bs) for bs in snap.buckets),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=clusters(),
    waves=st.lists(job_lists("w"), min_size=1, max_size=4),
    releases=st.lists(st.integers(0, 50), max_size=8),
)
def test_invariants_over_cycles(nodes: list[Node], waves: list[list[Job]], releases: list[int]) -> None:
    snap = Snapshot.build(nodes)
    twin = snap.copy()
    jobs: dict[JobId, Job] = {}
    for c, wave in enumerate(waves):
        wave = [Job(**{**_fields(j), "id": JobId(f"c{c}-{j.id}")}) for j in wave]
        jobs.update({j.id: j for j in wave})
        before = fingerprint(snap)
        plan = run_cycle(snap, wave, PROFILE, cycle=c)
        assert fingerprint(snap) == before, "a cycle changed the caller's snapshot"
        check_plan(snap, jobs, plan)
        assert {p.job.id for p in plan.placed} | {p.job_id for p in plan.pending} == {j.id for j in wave}
        # determinism: the same cycle on an independent copy gives the same bytes
        assert run_cycle(twin, wave, PROFILE, cycle=c).canonical_json() == plan.canonical_json()
        assert apply_plan(snap, plan) == []
        assert apply_plan(twin, plan) == []
        assert snap.check_invariants() == []
        running = sorted(snap.running)
        for r in releases[: len(running)]:
            if running:
                victim = running.pop(r % len(running))
                snap.release(victim)
                twin.release(victim)
        assert snap.check_invariants() == []
    assert fingerprint(snap) == fingerprint(twin)


def _fields(j: Job) -> dict[str, object]:
    return {f: getattr(j, f) for f in Job.__dataclass_fields__}
