"""A simulated cluster described in YAML: groups of identical nodes with their topology (pure).

```yaml
name: default
groups:
  - name: h100            # node ids are <name>-<i>
    count: 4
    gpu_model: H100-SXM5-80GB
    gpus_per_node: 8
    memory_mib: 81920
    nvlink: node          # node: the node's GPUs share NVLink; none: PCIe only
    nodes_per_nvlink_domain: 1   # > 1: a multi-node NVLink rack (e.g. 18 for NVL72 trays)
    leaf: leaf-a
    spine: spine-0
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gangline.events.ids import derived_id
from gangline.events.nodes import GpuInfo, NodeRegistered
from gangline.events.types import GpuId, MiB, NodeId


class NodeGroup(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    count: Annotated[int, Field(ge=1)]
    gpu_model: str
    gpus_per_node: Annotated[int, Field(ge=1, le=64)]
    memory_mib: Annotated[int, Field(ge=1)]
    nvlink: Literal["node", "none"] = "node"
    nodes_per_nvlink_domain: Annotated[int, Field(ge=1)] = 1
    leaf: str | None = None
    """The leaf switch of every node of the group; None spreads nodes over ``leaves``."""
    leaves: Annotated[int, Field(ge=1)] = 1
    spine: str = "spine-0"


class ClusterSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "cluster"
    groups: Annotated[tuple[NodeGroup, ...], Field(min_length=1)]

    def nodes(self) -> list[NodeRegistered]:
        """Every node's registration, in group order."""
        out: list[NodeRegistered] = []
        for group in self.groups:
            width = len(str(group.count - 1))
            per_leaf = -(-group.count // group.leaves)
            for i in range(group.count):
                node = NodeId(f"{group.name}-{i:0{width}d}")
                ids = [GpuId(f"gpu{k}") for k in range(group.gpus_per_node)]
                gpus = tuple(
                    GpuInfo(
                        id=gpu,
                        index=k,
                        uuid=f"GPU-{derived_id(node, gpu)}",
                        model=group.gpu_model,
                        memory_mib=MiB(group.memory_mib),
                        nvlink_peers=tuple(p for p in ids if p != gpu) if group.nvlink == "node" else (),
                    )
                    for k, gpu in enumerate(ids)
                )
                if group.nodes_per_nvlink_domain > 1:
                    domain = f"{group.name}-nvl{i // group.nodes_per_nvlink_domain}"
                else:
                    domain = node
                leaf = group.leaf or f"{group.name}-leaf{i // per_leaf}"
                out.append(
                    NodeRegistered(
                        node=node,
                        address=f"{node}.sim.local",
                        gpus=gpus,
                        nvlink_domain=domain,
                        leaf=leaf,
                        spine=group.spine,
                        labels={"gangline/simulated": "true"},
                        agent_version="fake-1",
                    )
                )
        return out

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.groups)


def load_cluster(path: str | Path) -> ClusterSpec:
    return ClusterSpec.model_validate(yaml.safe_load(Path(path).read_text(encoding="utf-8")))


def uniform_cluster(nodes: int, *, gpus_per_node: int = 8, nodes_per_leaf: int = 32) -> ClusterSpec:
    """``nodes`` identical 8-GPU H100 nodes, ``nodes_per_leaf`` to a leaf switch (benchmarks)."""
    return ClusterSpec(
        name=f"uniform-{nodes}",
        groups=(
            NodeGroup(
                name="n",
                count=nodes,
                gpu_model="H100-SXM5-80GB",
                gpus_per_node=gpus_per_node,
                memory_mib=81920,
                leaves=max(1, -(-nodes // nodes_per_leaf)),
            ),
        ),
    )
