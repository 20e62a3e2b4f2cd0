"""The cluster spec: one YAML format for `gangline simulate`, `gangline fake-nodes` and `make up` (pure).

One file describes the hardware, groups of identical nodes with their topology; queues and
quotas are not part of it (they live in the queues file, :mod:`gangline.queues_file`). The same
groups build the simulator's core :class:`~gangline.core.model.Node`\\ s (:meth:`ClusterSpec.build_nodes`)
and the fake nodes' ``node.registered`` events (:meth:`ClusterSpec.registrations`): a simulated
cluster and a fake-node cluster built from one file have the same node ids, GPU ids and labels.

```yaml
name: default
topology: {nodes_per_leaf: 16, leaves_per_spine: 8}   # for groups without a `leaf` (defaults shown)
groups:                            # nodes are built group by group, in order
  - name: h100                     # node ids h100-0 ... (zero-padded to the count's width)
    count: 4
    gpu_model: H100-SXM5-80GB      # GPU ids gpu0 ... on the node; the core's are h100-0/gpu0 ...
    gpus_per_node: 8
    memory_mib: 81920
    mode: whole                    # whole | shared (milli-GPU shares, as in the Alibaba trace)
    nvlink: node                   # node: the node's GPUs share NVLink; none: PCIe only
    nodes_per_nvlink_domain: 1     # > 1: a multi-node NVLink rack (e.g. 18 trays of an NVL72)
    leaf: leaf-a                   # explicit labels; omit both to have them generated
    spine: spine-0
```

Generated labels: each group without a ``leaf`` starts a new leaf switch ``leaf-NNN`` and fills
it with ``topology.nodes_per_leaf`` nodes before the next; ``topology.leaves_per_spine``
consecutive leaves share a spine ``spine-NN``. A group with a ``leaf`` puts all its nodes under it
(and under ``spine``, ``spine-0`` when omitted). A multi-node NVLink domain never spans leaves.

Pools (optional) split the cluster by one node label; every node must be in one of them:

```yaml
pools: {label: spine, names: [spine-a, spine-b]}   # or gpu_model, leaf, or a key of the nodes' labels
```

A ``shared`` group's GPUs are shared by milli fractions in the simulator; ``node.registered`` has
no field for that, so its registrations show whole GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gangline.core.model import GpuMode, GpuModel, Node
from gangline.core.pools import PoolLayout, PoolLayoutError
from gangline.core.queues import Resource, gpu_resource
from gangline.events.ids import derived_id
from gangline.events.nodes import GpuInfo, NodeRegistered
from gangline.events.types import GpuId, MiB, NodeId
from gangline.fold.adapter import core_node, pool_labels

DEFAULT_SPINE = "spine-0"
SIMULATED_LABEL = "gangline/simulated"
SHARED_SUFFIX = "/milli"
MILLI_PER_GPU = 1000


class ClusterSpecError(ValueError):
    """A cluster spec that cannot be used; the message names the file and the field."""


class Topology(BaseModel):
    """How generated leaf and spine labels are drawn (see module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes_per_leaf: Annotated[int, Field(ge=1)] = 16
    leaves_per_spine: Annotated[int, Field(ge=1)] = 8


class NodeGroup(BaseModel):
    """``count`` identical nodes (see module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    count: Annotated[int, Field(ge=1)]
    gpu_model: Annotated[str, Field(min_length=1)]
    gpus_per_node: Annotated[int, Field(ge=1, le=64)]
    memory_mib: Annotated[int, Field(ge=1)]
    mode: Literal["whole", "shared"] = "whole"
    nvlink: Literal["node", "none"] = "node"
    nodes_per_nvlink_domain: Annotated[int, Field(ge=1)] = 1
    leaf: Annotated[str, Field(min_length=1)] | None = None
    """The leaf switch of every node of the group; None: generated from the spec's topology."""
    spine: Annotated[str, Field(min_length=1)] | None = None
    """The spine of ``leaf``; only with ``leaf`` (generated leaves get generated spines)."""

    @model_validator(mode="after")
    def _labels(self) -> NodeGroup:
        if self.spine is not None and self.leaf is None:
            raise ValueError(f"group {self.name}: spine is given without leaf (give both, or neither)")
        return self

    def node_ids(self) -> list[NodeId]:
        """``<name>-<i>``, zero-padded to the width of the last index."""
        width = len(str(self.count - 1))
        return [NodeId(f"{self.name}-{i:0{width}d}") for i in range(self.count)]

    @property
    def gpu_mode(self) -> GpuMode:
        return GpuMode(self.mode)


class Pools(BaseModel):
    """How the cluster is split into pools (see module docstring): a node label and its pools, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: Annotated[str, Field(min_length=1)]
    """``spine``, ``leaf``, ``nvlink_domain``, ``gpu_model``, or a key of the nodes' ``labels`` (a region)."""
    names: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(min_length=1)]
    """The pools: values of ``label``. A pool's index is its partition of every pooled topic."""

    def layout(self) -> PoolLayout:
        return PoolLayout(self.label, self.names)


class ClusterSpec(BaseModel):
    """A validated cluster spec (see module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1)] = "cluster"
    topology: Topology = Topology()
    groups: Annotated[tuple[NodeGroup, ...], Field(min_length=1)]
    pools: Pools | None = None
    """The pools the cluster is split into (None: one pool, the whole cluster); the services read the same
    layout from ``GANGLINE_POOLS`` (``label=pool,...``: :meth:`Pools.layout`'s text)."""

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        names = [g.name for g in self.groups]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"group name {twice[0]} repeats (node ids would collide)")
        if self.pools is not None:
            try:
                layout = self.pools.layout()
            except PoolLayoutError as e:
                raise ValueError(f"pools: {e}") from None
            unpooled = sorted(
                {r.node for r in self.registrations() if layout.pool_of(pool_labels(r)) is None}
            )
            if unpooled:
                raise ValueError(
                    f"pools: nodes whose {layout.label} names no pool of {list(layout.pools)}: {unpooled[:5]}"
                )
        for g in self.groups:
            per_domain = g.nodes_per_nvlink_domain
            if g.leaf is None and per_domain > 1 and self.topology.nodes_per_leaf % per_domain:
                raise ValueError(
                    f"group {g.name}: nodes_per_nvlink_domain {per_domain} does not divide "
                    f"topology.nodes_per_leaf {self.topology.nodes_per_leaf}: an NVLink domain would "
                    "span two leaves (give the group a leaf, or change the topology)"
                )
        return self

    @property
    def total_gpus(self) -> int:
        """Physical GPUs in the cluster."""
        return sum(g.count * g.gpus_per_node for g in self.groups)

    @property
    def node_count(self) -> int:
        """Nodes in the cluster."""
        return sum(g.count for g in self.groups)

    def capacity(self) -> dict[GpuModel, int]:
        """Physical GPUs per model."""
        out: dict[GpuModel, int] = {}
        for g in self.groups:
            out[GpuModel(g.gpu_model)] = out.get(GpuModel(g.gpu_model), 0) + g.count * g.gpus_per_node
        return out

    def resources(self) -> dict[Resource, int]:
        """Capacity per quota resource (whole-GPU models; shared GPUs count in milli)."""
        out: dict[Resource, int] = {}
        for g in self.groups:
            shared = g.gpu_mode is GpuMode.SHARED
            key = Resource(f"{g.gpu_model}{SHARED_SUFFIX}") if shared else gpu_resource(GpuModel(g.gpu_model))
            out[key] = out.get(key, 0) + g.count * g.gpus_per_node * (MILLI_PER_GPU if shared else 1)
        return out

    def grouped_registrations(self) -> list[tuple[NodeGroup, NodeRegistered]]:
        """Every node's group and ``node.registered`` event, in group order."""
        out: list[tuple[NodeGroup, NodeRegistered]] = []
        leaf_no = -1
        for group in self.groups:
            generated = group.leaf is None
            for i, node in enumerate(group.node_ids()):
                if generated and i % self.topology.nodes_per_leaf == 0:
                    leaf_no += 1
                if generated:
                    leaf = f"leaf-{leaf_no:03d}"
                    spine = f"spine-{leaf_no // self.topology.leaves_per_spine:02d}"
                else:
                    leaf, spine = str(group.leaf), group.spine or DEFAULT_SPINE
                out.append((group, _registration(group, i, node, leaf, spine)))
        return out

    def registrations(self) -> list[NodeRegistered]:
        """Every node's ``node.registered`` event (what the fake nodes publish), in group order."""
        return [reg for _, reg in self.grouped_registrations()]

    def build_nodes(self) -> list[Node]:
        """The simulator's core nodes: the registrations as the services read them (one adapter),
        with shared groups' GPUs in shared mode."""
        out: list[Node] = []
        for group, reg in self.grouped_registrations():
            node = core_node(reg, cordoned=False, unusable_gpus=frozenset())
            if group.gpu_mode is not GpuMode.WHOLE:
                node = replace(node, gpus=tuple(replace(g, mode=group.gpu_mode) for g in node.gpus))
            out.append(node)
        return out


def _registration(group: NodeGroup, i: int, node: NodeId, leaf: str, spine: str) -> NodeRegistered:
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
    per_domain = group.nodes_per_nvlink_domain
    domain = f"{group.name}-nvl{i // per_domain}" if per_domain > 1 else node
    return NodeRegistered(
        node=node,
        address=f"{node}.sim.local",
        gpus=gpus,
        nvlink_domain=domain,
        leaf=leaf,
        spine=spine,
        labels={SIMULATED_LABEL: "true"},
        agent_version="fake-1",
    )


def _problems(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg'].removeprefix('Value error, ')}"
        for err in e.errors()
    )


def cluster_spec_from_mapping(doc: Mapping[str, Any], *, source: str = "cluster spec") -> ClusterSpec:
    """Validate a parsed spec document; :class:`ClusterSpecError` names ``source`` and the field."""
    try:
        return ClusterSpec.model_validate(doc)
    except ValidationError as e:
        raise ClusterSpecError(f"{source}: {_problems(e)}") from None


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster spec YAML file."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, Mapping):
        raise ClusterSpecError(f"{path}: a cluster spec is a YAML mapping")
    return cluster_spec_from_mapping(doc, source=str(path))


def uniform_cluster(nodes: int, *, gpus_per_node: int = 8, nodes_per_leaf: int = 32) -> ClusterSpec:
    """``nodes`` identical 8-GPU H100 nodes, ``nodes_per_leaf`` to a leaf switch (benchmarks)."""
    return ClusterSpec(
        name=f"uniform-{nodes}",
        topology=Topology(nodes_per_leaf=nodes_per_leaf),
        groups=(
            NodeGroup(
                name="n",
                count=nodes,
                gpu_model="H100-SXM5-80GB",
                gpus_per_node=gpus_per_node,
                memory_mib=81920,
            ),
        ),
    )
