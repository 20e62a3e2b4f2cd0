"""Cluster spec files: the shipped specs load with the sizes their comments claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.core.model import GpuModel, QueueName
from gangline.core.queues import gpu_resource
from gangline.core.snapshot import Snapshot
from gangline.sim.cluster import ClusterSpecError, load_cluster_spec, spec_from_mapping

CLUSTERS = Path(__file__).resolve().parents[3] / "deploy" / "clusters"


def test_philly_spec_is_352_nodes_2464_gpus_with_quotas_adding_up() -> None:
    spec = load_cluster_spec(CLUSTERS / "philly.yaml")
    assert (spec.node_count, spec.total_gpus) == (352, 2464)
    assert len(spec.queues) == 11
    assert sum(sum(q.quota.values()) for q in spec.queues) == 2464
    tree = spec.quota_tree([QueueName("6214e9"), QueueName("23dbec")])
    assert tree.nominal(QueueName("6214e9"), gpu_resource("philly-gpu")) == 448
    assert tree.nominal(QueueName("23dbec"), gpu_resource("philly-gpu")) == 0
    assert tree.same_tree(QueueName("23dbec"), QueueName("6214e9"))  # borrows through the cohort
    snap = Snapshot(spec.build_nodes())
    assert snap.max_per_node == 8
    assert len({n.leaf for n in snap.nodes}) == 22  # 17 + 4 + 1 leaves of up to 16 nodes, per group


def test_alibaba_spec_matches_the_node_list() -> None:
    spec = load_cluster_spec(CLUSTERS / "alibaba-openb.yaml")
    assert (spec.node_count, spec.total_gpus) == (1213, 6212)
    assert spec.capacity()[GpuModel("G2")] == 4392


def test_leaves_never_mix_groups() -> None:
    spec = spec_from_mapping(
        {
            "name": "x",
            "topology": {"nodes_per_leaf": 4, "leaves_per_spine": 2},
            "node_groups": [
                {"prefix": "a", "count": 5, "gpus_per_node": 8, "model": "A"},
                {"prefix": "b", "count": 2, "gpus_per_node": 4, "model": "B"},
            ],
        }
    )
    leaves = {str(n.id): n.leaf for n in spec.build_nodes()}
    assert leaves["a-0000"] == leaves["a-0003"] != leaves["a-0004"]
    assert leaves["b-0000"] not in {leaves["a-0004"], leaves["a-0000"]}


def test_unlisted_queues_can_be_refused() -> None:
    spec = spec_from_mapping(
        {
            "name": "x",
            "node_groups": [{"prefix": "a", "count": 1, "gpus_per_node": 8, "model": "A"}],
            "queues": [{"name": "t", "quota": {"A": 8}}],
            "unlisted_queues": "reject",
        }
    )
    with pytest.raises(ClusterSpecError, match="lacks: other"):
        spec.quota_tree([QueueName("t"), QueueName("other")])


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"name": "x"}, "node_groups"),
        (
            {"name": "x", "node_groups": [{"prefix": "a", "count": -1, "gpus_per_node": 8, "model": "A"}]},
            "count",
        ),
        (
            {
                "name": "x",
                "node_groups": [{"prefix": "a", "count": 1, "gpus_per_node": 8, "model": "A", "mode": "mig"}],
            },
            "mode",
        ),
    ],
)
def test_bad_specs_name_the_field(doc: dict[str, object], problem: str) -> None:
    with pytest.raises(ClusterSpecError, match=problem):
        spec_from_mapping(doc)
