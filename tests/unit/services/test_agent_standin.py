"""Stand-in nodes built from a cluster YAML register what the lightweight fake registers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.agent.node import registration
from gangline.cluster_spec import load_cluster_spec
from gangline.events.types import NodeId
from gangline.nvml.reader import NvmlReader
from gangline.nvml.standin import NvmlStandIn
from services.agent.standin import StandInCluster, XidInjection, node_spec_for
from services.common.topics import TopicNames

ROOT = Path(__file__).resolve().parents[3]


def test_every_node_of_the_default_cluster_registers_as_the_fake_does() -> None:
    spec = load_cluster_spec(ROOT / "deploy/clusters/default.yaml")
    cluster = StandInCluster(
        spec=spec, bootstrap="127.0.0.1:9092", topics=TopicNames(prefix="x."), group_id="g"
    )
    pairs = spec.grouped_registrations()
    assert len(pairs) == sum(g.count for g in spec.groups)
    for group, fake in pairs:
        api = NvmlStandIn(node_spec_for(group, fake.node))
        inventory = NvmlReader(api, node=fake.node).inventory()
        reg = registration(inventory, cluster.settings_for(fake, Path("/tmp/standin-unit")))
        assert (reg.node, reg.nvlink_domain, reg.leaf, reg.spine) == (
            fake.node,
            fake.nvlink_domain,
            fake.leaf,
            fake.spine,
        )
        assert [(g.id, g.index, g.model, g.memory_mib) for g in reg.gpus] == [
            (g.id, g.index, g.model, g.memory_mib) for g in fake.gpus
        ]
        assert [sorted(g.nvlink_peers) for g in reg.gpus] == [sorted(g.nvlink_peers) for g in fake.gpus]
        assert reg.labels["gangline/nvml"] == "standin"


def test_gpus_of_an_nvlink_none_group_have_no_peers_and_uuids_differ_per_node() -> None:
    spec = load_cluster_spec(ROOT / "deploy/clusters/default.yaml")
    l40s = [(g, n) for g, n in spec.grouped_registrations() if g.nvlink == "none"]
    assert l40s
    uuids = set()
    for group, fake in l40s:
        inventory = NvmlReader(NvmlStandIn(node_spec_for(group, fake.node)), node=fake.node).inventory()
        assert all(not d.gpus[1:] for d in inventory.nvlink_domains)
        uuids |= {g.uuid for g in inventory.gpus}
    assert len(uuids) == sum(g.gpus_per_node for g, _ in l40s)


def test_xid_injections_parse_from_the_command_line() -> None:
    assert XidInjection.parse("h100-0:gpu3:79@12.5") == XidInjection(NodeId("h100-0"), "gpu3", 79, 12.5)
    assert XidInjection.parse("n-1:gpu0:13") == XidInjection(NodeId("n-1"), "gpu0", 13, 0.0)
    for bad in ("n-1:gpu0", "n-1::79@3", "n-1:gpu0:x@1"):
        with pytest.raises(ValueError):
            XidInjection.parse(bad)
