"""The cluster spec: one file builds the simulator's nodes and the fake nodes' registrations alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.cluster_spec import (
    ClusterSpec,
    ClusterSpecError,
    cluster_spec_from_mapping,
    load_cluster_spec,
    uniform_cluster,
)
from gangline.core.model import GpuMode, GpuModel
from gangline.core.queues import gpu_resource
from gangline.core.snapshot import Snapshot
from gangline.fold.adapter import core_gpu_id, core_node
from gangline.queues_file import load_queues

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "deploy" / "clusters"
QUEUES = ROOT / "deploy" / "queues"


def _spec(*groups: dict[str, object], **top: object) -> ClusterSpec:
    return cluster_spec_from_mapping({"name": "x", **top, "groups": list(groups)})


def _group(name: str, count: int, gpus: int = 8, **more: object) -> dict[str, object]:
    return {
        "name": name,
        "count": count,
        "gpus_per_node": gpus,
        "gpu_model": "A100",
        "memory_mib": 81920,
        **more,
    }


def test_generated_labels_fill_leaves_in_order_and_never_mix_groups() -> None:
    spec = _spec(_group("a", 5), _group("b", 2, 4), topology={"nodes_per_leaf": 4, "leaves_per_spine": 2})
    labels = {r.node: (r.leaf, r.spine) for r in spec.registrations()}
    assert labels == {
        "a-0": ("leaf-000", "spine-00"),
        "a-1": ("leaf-000", "spine-00"),
        "a-2": ("leaf-000", "spine-00"),
        "a-3": ("leaf-000", "spine-00"),
        "a-4": ("leaf-001", "spine-00"),
        "b-0": ("leaf-002", "spine-01"),
        "b-1": ("leaf-002", "spine-01"),
    }


def test_explicit_labels_put_a_whole_group_under_one_leaf_and_spine() -> None:
    spec = _spec(
        _group("h", 2, leaf="leaf-a", spine="spine-1"),
        _group("g", 4, 4, leaf="leaf-b", nodes_per_nvlink_domain=2, nvlink="node"),
        _group("p", 1, 2, nvlink="none"),
    )
    regs = {r.node: r for r in spec.registrations()}
    assert [(r.leaf, r.spine) for r in regs.values()] == [("leaf-a", "spine-1")] * 2 + [
        ("leaf-b", "spine-0")
    ] * 4 + [("leaf-000", "spine-00")]
    assert [regs[n].nvlink_domain for n in ("g-0", "g-1", "g-2", "g-3")] == [
        "g-nvl0",
        "g-nvl0",
        "g-nvl1",
        "g-nvl1",
    ]
    assert regs["h-1"].nvlink_domain == "h-1"
    assert regs["h-0"].gpus[0].nvlink_peers == tuple(f"gpu{k}" for k in range(1, 8))
    assert regs["p-0"].gpus[0].nvlink_peers == ()


def test_node_ids_are_padded_to_the_width_of_the_group() -> None:
    spec = _spec(_group("n", 12, 1))
    assert [r.node for r in spec.registrations()][::11] == ["n-00", "n-11"]


def test_simulated_nodes_and_fake_node_registrations_from_one_file_are_the_same_cluster() -> None:
    spec = load_cluster_spec(CLUSTERS / "default.yaml")
    regs = spec.registrations()
    nodes = spec.build_nodes()
    assert [n.id for n in nodes] == [r.node for r in regs]
    for node, reg in zip(nodes, regs, strict=True):
        assert (node.leaf, node.spine, node.domain) == (reg.leaf, reg.spine, reg.nvlink_domain)
        assert [(g.id, g.index, g.model, g.memory_mib, g.mode) for g in node.gpus] == [
            (core_gpu_id(reg.node, g.id), g.index, g.model, g.memory_mib, GpuMode.WHOLE) for g in reg.gpus
        ]
        # What the services build from the registration is exactly the simulator's node.
        assert core_node(reg, cordoned=False, unusable_gpus=frozenset()) == node
    assert (
        Snapshot(nodes).capacity
        == Snapshot([core_node(r, cordoned=False, unusable_gpus=frozenset()) for r in regs]).capacity
    )


def test_shared_groups_are_shared_in_the_simulator_and_whole_on_the_wire() -> None:
    spec = _spec(_group("s", 1, 2, mode="shared"))
    [node] = spec.build_nodes()
    [reg] = spec.registrations()
    assert {g.mode for g in node.gpus} == {GpuMode.SHARED}
    assert not any(g.mig_enabled for g in reg.gpus)
    assert spec.resources() == {"A100/milli": 2000}


def test_uniform_cluster_is_the_benchmarks_h100_fabric() -> None:
    spec = uniform_cluster(70, nodes_per_leaf=32)
    regs = spec.registrations()
    assert (spec.node_count, spec.total_gpus) == (70, 560)
    assert len({r.leaf for r in regs}) == 3
    assert {g.model for r in regs for g in r.gpus} == {"H100-SXM5-80GB"}


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"name": "x"}, r"groups: Field required"),
        ({"name": "x", "groups": []}, r"groups: .*at least 1"),
        ({"name": "x", "groups": [_group("a", 0)]}, r"groups\.0\.count"),
        ({"name": "x", "groups": [_group("a", 1, mode="mig")]}, r"groups\.0\.mode"),
        ({"name": "x", "groups": [_group("a", 1, spine="s")]}, r"group a: spine is given without leaf"),
        ({"name": "x", "groups": [_group("a", 1), _group("a", 2)]}, r"group name a repeats"),
        ({"name": "x", "groups": [_group("a", 1, prefix="a")]}, r"groups\.0\.prefix: Extra inputs"),
        (
            {"name": "x", "groups": [_group("r", 36, 4, nodes_per_nvlink_domain=18)]},
            r"group r: nodes_per_nvlink_domain 18 does not divide topology.nodes_per_leaf 16",
        ),
        ({"name": "x", "queues": [], "groups": [_group("a", 1)]}, r"queues: Extra inputs"),
    ],
)
def test_bad_specs_name_the_field(doc: dict[str, object], problem: str) -> None:
    with pytest.raises(ClusterSpecError, match=problem):
        cluster_spec_from_mapping(doc)


def test_a_file_that_is_not_a_mapping_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("- just a list\n", encoding="utf-8")
    with pytest.raises(ClusterSpecError, match=r"c\.yaml: a cluster spec is a YAML mapping"):
        load_cluster_spec(path)
    path.write_text("name: c\ngroups: [{name: a}]\n", encoding="utf-8")
    with pytest.raises(ClusterSpecError, match=r"c\.yaml: groups\.0\.count: Field required"):
        load_cluster_spec(path)


@pytest.mark.parametrize("path", sorted(CLUSTERS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_cluster_loads_and_builds(path: Path) -> None:
    spec = load_cluster_spec(path)
    nodes = spec.build_nodes()
    assert len(nodes) == spec.node_count == len(spec.registrations())
    assert sum(len(n.gpus) for n in nodes) == spec.total_gpus
    Snapshot(nodes)  # topology labels consistent (a domain in one leaf, a leaf under one spine)


def test_philly_is_352_nodes_2464_gpus_with_quotas_adding_up() -> None:
    spec = load_cluster_spec(CLUSTERS / "philly.yaml")
    assert (spec.node_count, spec.total_gpus) == (352, 2464)
    assert len({n.leaf for n in spec.build_nodes()}) == 22  # 17 + 4 + 1 leaves of up to 16 nodes, per group
    queues = load_queues(QUEUES / "philly.yaml")
    philly = gpu_resource("philly-gpu")
    names = queues.tree.queue_names()
    assert len(names) == 15 and not queues.unlimited
    assert sum(queues.tree.nominal(q, philly) for q in names) == 2464
    assert queues.tree.nominal("23dbec", philly) == 0
    assert queues.tree.same_tree("23dbec", "6214e9")  # borrows through the cohort


@pytest.mark.parametrize(
    ("name", "gpus"), [("philly-contended", 490), ("philly-quarter", 616), ("small", 64)]
)
def test_each_queues_file_divides_its_cluster(name: str, gpus: int) -> None:
    spec = load_cluster_spec(CLUSTERS / f"{name}.yaml")
    queues = load_queues(QUEUES / f"{name}.yaml")
    model = next(iter(spec.capacity()))
    assert spec.total_gpus == gpus
    assert sum(queues.tree.nominal(q, gpu_resource(model)) for q in queues.tree.queue_names()) == gpus


def test_alibaba_matches_the_node_list() -> None:
    spec = load_cluster_spec(CLUSTERS / "alibaba-openb.yaml")
    assert (spec.node_count, spec.total_gpus) == (1213, 6212)
    assert spec.capacity()[GpuModel("G2")] == 4392
    assert {g.mode for n in spec.build_nodes() for g in n.gpus} == {GpuMode.SHARED}
