"""Cluster spec files: the simulated cluster's nodes, topology and queues (pure + reading YAML).

```yaml
name: small
topology: {nodes_per_leaf: 16, leaves_per_spine: 8}   # how nodes are wired (defaults shown)
node_groups:                       # nodes are built group by group, in order
  - prefix: a8                     # node ids a8-0000, a8-0001, ...; GPU ids a8-0000-g0, ...
    count: 4
    gpus_per_node: 8
    model: A100                    # GPU model (the quota resource of whole GPUs)
    memory_mib: 81920
    mode: whole                    # whole | shared (milli-GPU shares, as in the Alibaba trace)
cohort: everyone                   # every queue lends and borrows in this cohort (omit: no borrowing)
queues:                            # nominal quota per GPU model; weight scales fair share
  - {name: team-a, quota: {A100: 16}, weight: 1}
unlisted_queues: borrow            # queues a trace names but the spec does not: borrow (nominal 0) | reject
```

Leaves never mix node groups: each group starts a new leaf.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gangline.core.model import DomainId, Gpu, GpuId, GpuMode, GpuModel, MiB, Node, NodeId, QueueName
from gangline.core.queues import CohortName, QueueSpec, QuotaTree, Resource, ResourceQuota, gpu_resource


class ClusterSpecError(ValueError):
    """A cluster spec that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """`count` identical nodes."""

    prefix: str
    count: int
    gpus_per_node: int
    model: GpuModel
    memory_mib: MiB
    mode: GpuMode = GpuMode.WHOLE


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """A queue of the spec: nominal quota per GPU model, and its fair-share weight."""

    name: QueueName
    quota: Mapping[GpuModel, int] = field(default_factory=dict)
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A parsed spec (see module docstring)."""

    name: str
    groups: tuple[NodeGroup, ...]
    queues: tuple[QueueQuota, ...] = ()
    cohort: str | None = None
    unlisted_queues: str = "borrow"
    nodes_per_leaf: int = 16
    leaves_per_spine: int = 8

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
            out[g.model] = out.get(g.model, 0) + g.count * g.gpus_per_node
        return out

    def build_nodes(self) -> list[Node]:
        """The cluster's nodes with leaf and spine labels (see module docstring)."""
        nodes: list[Node] = []
        leaf_no = 0
        for grp in self.groups:
            for i in range(grp.count):
                if i % self.nodes_per_leaf == 0 and (i or nodes):
                    leaf_no += 1
                node_id = NodeId(f"{grp.prefix}-{i:04d}")
                gpus = tuple(
                    Gpu(GpuId(f"{node_id}-g{k}"), k, grp.model, grp.memory_mib, mode=grp.mode)
                    for k in range(grp.gpus_per_node)
                )
                nodes.append(
                    Node(
                        id=node_id,
                        gpus=gpus,
                        leaf=DomainId(f"leaf-{leaf_no:03d}"),
                        spine=DomainId(f"spine-{leaf_no // self.leaves_per_spine:02d}"),
                    )
                )
        return nodes

    def quota_tree(self, trace_queues: Iterable[QueueName]) -> QuotaTree:
        """Queues of the spec plus the trace's unlisted ones (nominal 0, borrowing), or an error."""
        cohort = CohortName(self.cohort) if self.cohort else None
        listed = {q.name for q in self.queues}
        extra = sorted(set(trace_queues) - listed)
        if extra and self.unlisted_queues == "reject":
            raise ClusterSpecError(f"trace names queues the spec lacks: {', '.join(extra)}")
        specs = [
            QueueSpec(
                name=q.name,
                quotas={gpu_resource(m): ResourceQuota(n) for m, n in q.quota.items()},
                cohort=cohort,
                weight=q.weight,
            )
            for q in self.queues
        ]
        specs += [QueueSpec(name=q, quotas={}, cohort=cohort) for q in extra]
        return QuotaTree(specs)

    def resources(self) -> dict[Resource, int]:
        """Capacity per quota resource (whole-GPU models; shared GPUs count in milli)."""
        out: dict[Resource, int] = {}
        for g in self.groups:
            key = Resource(f"{g.model}/milli") if g.mode is GpuMode.SHARED else gpu_resource(g.model)
            per = 1000 if g.mode is GpuMode.SHARED else 1
            out[key] = out.get(key, 0) + g.count * g.gpus_per_node * per
        return out


def _int(doc: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = doc.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ClusterSpecError(f"{where}.{key} must be a non-negative integer, got {v!r}")
    return v


def spec_from_mapping(doc: Mapping[str, Any]) -> ClusterSpec:
    """Validate a parsed spec document."""
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ClusterSpecError("cluster spec needs a name")
    topo = doc.get("topology") or {}
    if not isinstance(topo, Mapping):
        raise ClusterSpecError("topology must be a mapping")
    per_leaf = _int(topo, "nodes_per_leaf", "topology", 16)
    per_spine = _int(topo, "leaves_per_spine", "topology", 8)
    if per_leaf < 1 or per_spine < 1:
        raise ClusterSpecError("topology sizes must be >= 1")
    groups: list[NodeGroup] = []
    raw_groups = doc.get("node_groups")
    if not isinstance(raw_groups, list) or not raw_groups:
        raise ClusterSpecError("node_groups must be a non-empty list")
    prefixes: set[str] = set()
    for k, g in enumerate(raw_groups):
        where = f"node_groups[{k}]"
        if not isinstance(g, Mapping):
            raise ClusterSpecError(f"{where} must be a mapping")
        prefix, model = g.get("prefix"), g.get("model")
        if not isinstance(prefix, str) or not prefix or prefix in prefixes:
            raise ClusterSpecError(f"{where}.prefix must be a unique non-empty string")
        if not isinstance(model, str) or not model:
            raise ClusterSpecError(f"{where}.model must be a GPU model name")
        prefixes.add(prefix)
        mode = str(g.get("mode", "whole"))
        if mode not in ("whole", "shared"):
            raise ClusterSpecError(f"{where}.mode must be whole or shared")
        groups.append(
            NodeGroup(
                prefix=prefix,
                count=_int(g, "count", where),
                gpus_per_node=_int(g, "gpus_per_node", where),
                model=GpuModel(model),
                memory_mib=MiB(_int(g, "memory_mib", where, 16384) or 1),
                mode=GpuMode(mode),
            )
        )
    queues: list[QueueQuota] = []
    for k, q in enumerate(doc.get("queues") or []):
        where = f"queues[{k}]"
        if not isinstance(q, Mapping) or not isinstance(q.get("name"), str | int):
            raise ClusterSpecError(f"{where} needs a name (quote names YAML would read as numbers)")
        quota = q.get("quota") or {}
        if not isinstance(quota, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in quota.values()
        ):
            raise ClusterSpecError(f"{where}.quota must map GPU models to non-negative integers")
        weight = q.get("weight", 1.0)
        if not isinstance(weight, int | float) or weight <= 0:
            raise ClusterSpecError(f"{where}.weight must be > 0")
        queues.append(
            QueueQuota(
                QueueName(str(q["name"])), {GpuModel(str(m)): int(v) for m, v in quota.items()}, float(weight)
            )
        )
    if len({q.name for q in queues}) != len(queues):
        raise ClusterSpecError("queue names repeat")
    unlisted = str(doc.get("unlisted_queues", "borrow"))
    if unlisted not in ("borrow", "reject"):
        raise ClusterSpecError("unlisted_queues must be borrow or reject")
    cohort = doc.get("cohort")
    if cohort is not None and not isinstance(cohort, str):
        raise ClusterSpecError("cohort must be a string")
    return ClusterSpec(name, tuple(groups), tuple(queues), cohort, unlisted, per_leaf, per_spine)


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster spec YAML file."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, Mapping):
        raise ClusterSpecError(f"{path}: a cluster spec is a YAML mapping")
    return spec_from_mapping(doc)
