"""Pools: a cluster split by one node label, each pool decided by its own placement (pure).

A pool is the set of nodes that share the value of one label of the cluster spec (a spine, a GPU model,
a region); the layout (:class:`PoolLayout`) names the label and the pools in order, and a pool's index is
its partition of every pooled topic (:mod:`gangline.bus.pools`). Placement, preemption and node_health
run one owner per pool; quota, which sees every queue, routes each job it lets through to one pool
(:func:`route`).

**A gang never spans pools.** Its ranks talk over the fabric a pool is drawn along (a spine, one GPU
model's interconnect, a region), and a pool's owner decides alone, from its pool's partitions: two owners
could only grant one gang together with a two-phase protocol between them, which is what one writer per
pool is there to avoid. So a job goes to one pool that can hold it whole (:class:`PooledHardware`: its
workers all in one pool, on that pool's usable hardware), as Kueue admits a workload to one flavour and
Volcano binds a job to one queue's nodes. A job no pool can hold whole waits, with the reason of the
roomiest pool, even when the cluster as a whole could hold it; it never runs split.

Routing (:func:`route`), once per job, at its admission: among the pools that can hold the job whole on
one of its GPU models (its flavours'), the one with the most usable GPUs of those models left after what
is already routed there and not finished; ties by name. A job keeps its pool for all its attempts (its
records and its allocation ids live in that pool's partitions): quota charges it only to a model its pool
holds it on, and a requeue or a move to another model stays there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gangline.core.framework.status import Reason, ReasonCode, Status
from gangline.core.hardware import Hardware, NodeOffer, WorkerAsk
from gangline.core.model import GpuModel

NAME = "pools"

POOL_LABELS = ("spine", "leaf", "nvlink_domain", "gpu_model")
"""Labels every node registration carries; any other name is read from the node's ``labels``."""


class PoolLayoutError(ValueError):
    """A pool layout that cannot be used (the message says why)."""


@dataclass(frozen=True)
class PoolLayout:
    """Which label splits the cluster, and its pools in order (a pool's index is its partition)."""

    label: str
    pools: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.label:
            raise PoolLayoutError("a pool layout needs the label that splits the cluster")
        if not self.pools:
            raise PoolLayoutError("a pool layout needs at least one pool")
        if len(set(self.pools)) != len(self.pools):
            raise PoolLayoutError(f"pools named twice: {list(self.pools)}")

    @classmethod
    def parse(cls, text: str) -> PoolLayout:
        """``label=pool,pool,...`` (the ``GANGLINE_POOLS`` setting), e.g. ``spine=spine-a,spine-b``."""
        label, sep, names = text.partition("=")
        if not sep:
            raise PoolLayoutError(
                f"pools {text!r}: expected label=pool,pool,... (e.g. spine=spine-a,spine-b)"
            )
        return cls(label.strip(), tuple(n.strip() for n in names.split(",") if n.strip()))

    def __str__(self) -> str:
        return f"{self.label}={','.join(self.pools)}"

    def partition(self, pool: str) -> int:
        """The partition of ``pool`` in every pooled topic."""
        try:
            return self.pools.index(pool)
        except ValueError:
            raise PoolLayoutError(f"no pool {pool!r}; the pools are {list(self.pools)}") from None

    def pool_of(self, labels: Mapping[str, str]) -> str | None:
        """The pool of a node with ``labels`` (None: its label names no pool of the layout)."""
        value = labels.get(self.label)
        return value if value in self.pools else None

    def check_partitions(self, partitions: int, topic: str) -> None:
        """Raise unless ``topic`` has a partition for every pool."""
        if partitions < len(self.pools):
            raise PoolLayoutError(
                f"{topic} has {partitions} partitions for {len(self.pools)} pools: "
                "a pool needs a partition of every pooled topic"
            )


@dataclass
class PooledHardware:
    """The usable hardware of each pool, counted as :class:`~gangline.core.hardware.Hardware` counts a
    cluster; ``holds`` asks whether one pool can hold a job whole (the module docstring)."""

    pools: dict[str, Hardware] = field(default_factory=dict)

    def add(self, pool: str, offer: NodeOffer) -> None:
        self.pools.setdefault(pool, Hardware()).add(offer)

    def remove(self, pool: str, offer: NodeOffer) -> None:
        self.pools[pool].remove(offer)

    def holds(self, model: GpuModel, ask: WorkerAsk) -> Status:
        """Success when a pool's GPUs of ``model`` hold ``ask`` whole; else the first pool's reason."""
        first: Status | None = None
        for name in sorted(self.pools):
            status = self.pools[name].holds(model, ask)
            if status.ok:
                return status
            if first is None:
                first = _in_pool(name, status)
        if first is None:
            return Status.unresolvable(
                f"no pool has {model} GPUs",
                plugin=NAME,
                code=ReasonCode.GPU_TYPE,
                details={"gpu_type": model},
            )
        return first

    def only(self, name: str) -> OnePool:
        """One pool's hardware, whose reasons name the pool (a job routed there is held there only)."""
        return OnePool(name, self.pools.get(name) or Hardware())

    def pools_holding(self, model: GpuModel | None, ask: WorkerAsk) -> list[str]:
        """The pools that can hold ``ask`` whole on ``model`` (any of their models for None), by name."""
        return [
            name
            for name in sorted(self.pools)
            if any(self.pools[name].holds(m, ask).ok for m in _models(self.pools[name], model))
        ]


@dataclass(frozen=True)
class OnePool:
    """A pool's hardware as :class:`~gangline.core.hardware.HoldsWorkers`: its reasons say the pool."""

    name: str
    hardware: Hardware

    def holds(self, model: GpuModel, ask: WorkerAsk) -> Status:
        status = self.hardware.holds(model, ask)
        return status if status.ok else _in_pool(self.name, status)


def _models(hardware: Hardware, model: GpuModel | None) -> Sequence[GpuModel]:
    return [model] if model is not None else hardware.models()


def _in_pool(pool: str, status: Status) -> Status:
    """``status`` with each reason saying the pool it is about (a gang never spans pools)."""
    reasons = tuple(
        Reason(r.code, r.plugin, f"in pool {pool} (a gang never spans pools): {r.message}", r.details)
        for r in status.reasons
    )
    return Status(status.code, reasons)


def route(
    models: Sequence[GpuModel | None],
    ask: WorkerAsk,
    hardware: PooledHardware,
    usable_gpus: Mapping[str, Mapping[GpuModel, int]],
    routed_gpus: Mapping[str, int],
    pools: Iterable[str],
) -> str | None:
    """The pool a job goes to (the module docstring), None when no pool of ``pools`` can hold it whole.

    ``models``: the GPU models the job may run on (its flavours'; None: any model). ``usable_gpus``: each
    pool's usable GPUs per model; ``routed_gpus``: each pool's GPUs asked by the jobs routed there and not
    finished.
    """
    holding = {p for model in models for p in hardware.pools_holding(model, ask)}
    best: tuple[int, str] | None = None
    for pool in sorted(pools):
        if pool not in holding:
            continue
        usable = usable_gpus.get(pool, {})
        wanted = set(usable) if None in models else {m for m in models if m is not None}
        room = sum(usable.get(m, 0) for m in wanted) - routed_gpus.get(pool, 0)
        if best is None or (-room, pool) < best:
            best = (-room, pool)
    return best[1] if best is not None else None
