"""Which GPU models can hold a job's workers at all: the cluster's usable hardware per model, whatever
is running on it.

A worker never spans nodes and never mixes models, so a model can hold a job when its usable GPUs
(healthy, on a node that takes work) can hold the job's fewest workers at once:

* whole GPUs: nodes each offering >= G GPUs (of at least the memory asked) hold ``k // G`` workers
  each, and together at least the fewest workers; a worker bigger than every node never fits;
* a MIG worker: GPUs of the model in MIG mode whose geometry offers the profile, each holding as many
  instances of it as fit side by side (:mod:`gangline.core.mig`); a model the core has no geometry for
  offers no profile;
* a fractional worker: the model's shared GPUs, each holding ``1000 // milli`` of them;
* a required topology (whole-GPU workers): one node, NVLink domain, leaf or spine of the model must
  hold them all (the same count, over that domain's nodes).

The answer is a :class:`~gangline.core.framework.status.Status`: success, or unresolvable with the
reason (``gang_size``, ``memory``, ``gpu_type``, ``mig_profile``, ``fraction``, ``topology``) naming
the model and what its largest node offers. It says nothing about what is free now: that is quota's
and placement's.

:class:`Hardware` counts node shapes (a node's usable GPUs of one model), so adding or removing a
node costs its own GPUs and a question costs the distinct shapes, whatever the number of nodes (one
with a required topology costs the domains, once per change of the counts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gangline.core.framework.status import ReasonCode, Status
from gangline.core.mig import MigGeometry, MigProfile, mig_geometry
from gangline.core.model import FULL_GPU_MILLI, GpuMode, GpuModel, Job, MiB, TopologyLevel, TopologyMode

NAME = "hardware"
G = TypeVar("G")
K = TypeVar("K")


@dataclass(frozen=True, slots=True, order=True)
class GpuOffer:
    """One usable GPU as a node offers it: its model, memory and mode."""

    model: GpuModel
    memory_mib: MiB
    mode: GpuMode = GpuMode.WHOLE


@dataclass(frozen=True, slots=True)
class NodeOffer:
    """The usable GPUs of one node (healthy, the node taking work), and the domains it is in."""

    gpus: tuple[GpuOffer, ...] = ()
    nvlink: str = ""
    leaf: str = ""
    spine: str = ""

    def domain(self, level: TopologyLevel) -> str:
        """The node's domain at ``level`` (NVLink domain, leaf or spine)."""
        if level is TopologyLevel.NVLINK:
            return self.nvlink
        return self.leaf if level is TopologyLevel.LEAF else self.spine


DOMAIN_LEVELS = (TopologyLevel.NVLINK, TopologyLevel.LEAF, TopologyLevel.SPINE)


@dataclass(frozen=True, slots=True)
class WorkerAsk:
    """What a job needs of one GPU model: its fewest workers, each ``gpus`` whole GPUs on one node, or
    one ``mig_profile`` slice, or ``milli`` thousandths of a shared GPU; optionally GPUs of at least
    ``memory_mib``."""

    workers: int
    gpus: int = 1
    memory_mib: int | None = None
    mig_profile: str | None = None
    milli: int | None = None
    within: TopologyLevel | None = None
    """A required topology: every whole-GPU worker inside one domain of this level."""

    @classmethod
    def of(cls, job: Job) -> WorkerAsk:
        """The ask of a core job (its fewest workers: an elastic gang may start smaller)."""
        return cls(
            workers=job.fewest_workers,
            gpus=job.gpus_per_worker,
            memory_mib=job.gpu_memory_mib,
            mig_profile=job.mig_profile,
            milli=job.gpu_milli,
            within=job.topology.level
            if job.topology is not None and job.topology.mode is TopologyMode.REQUIRED
            else None,
        )


def instances_per_gpu(geometry: MigGeometry, profile: MigProfile) -> int:
    """How many instances of ``profile`` one empty GPU holds side by side (lowest starts first)."""
    mask = compute = count = 0
    for start in sorted(profile.starts):
        if profile.mask_at(start) & mask or compute + profile.compute > geometry.compute_slices:
            continue
        mask |= profile.mask_at(start)
        compute += profile.compute
        count += 1
    return count


class HoldsWorkers(Protocol):
    """What can tell whether a GPU model's usable GPUs hold a job's workers: a cluster's :class:`Hardware`,
    or the pools' (:class:`gangline.core.pools.PooledHardware`: one pool must hold them whole)."""

    def holds(self, model: GpuModel, ask: WorkerAsk) -> Status: ...


class Hardware:
    """Usable GPUs per model, counted by node shape; ``add`` / ``remove`` one node's offer at a time."""

    __slots__ = ("_domains", "_mig", "_room", "_shared", "_whole")

    def __init__(self, nodes: Iterable[NodeOffer] = ()) -> None:
        self._whole: dict[GpuModel, Counter[tuple[MiB, ...]]] = {}
        """Per model: a node's usable whole GPUs' memories (sorted, largest first) → nodes of that shape."""
        self._mig: dict[GpuModel, Counter[MiB]] = {}
        """Per model: usable MIG-mode GPUs by memory."""
        self._shared: dict[GpuModel, Counter[MiB]] = {}
        """Per model: usable shared GPUs by memory."""
        self._domains: dict[tuple[GpuModel, TopologyLevel], dict[str, Counter[tuple[MiB, ...]]]] = {}
        """Per model and level: each domain's node shapes (as ``_whole``)."""
        self._room: dict[tuple[GpuModel, TopologyLevel, int, int | None], int] = {}
        """Workers of (model, level, GPUs, memory) the roomiest domain holds, until the next change."""
        for offer in nodes:
            self.add(offer)

    def add(self, offer: NodeOffer) -> None:
        """Count one node's usable GPUs."""
        self._change(offer, 1)

    def remove(self, offer: NodeOffer) -> None:
        """Stop counting a node's usable GPUs (exactly as added)."""
        self._change(offer, -1)

    def _change(self, offer: NodeOffer, delta: int) -> None:
        self._room.clear()
        whole: dict[GpuModel, list[MiB]] = {}
        for gpu in offer.gpus:
            if gpu.mode is GpuMode.WHOLE:
                whole.setdefault(gpu.model, []).append(gpu.memory_mib)
            else:
                table = self._mig if gpu.mode is GpuMode.MIG else self._shared
                _bump(table, gpu.model, gpu.memory_mib, delta)
        for model, memories in whole.items():
            shape = tuple(sorted(memories, reverse=True))
            _bump(self._whole, model, shape, delta)
            for level in DOMAIN_LEVELS:
                _bump(self._domains.setdefault((model, level), {}), offer.domain(level), shape, delta)

    def models(self) -> list[GpuModel]:
        """The models some counted node offers usable GPUs of, sorted."""
        return sorted({*self._whole, *self._mig, *self._shared})

    def largest_node(self, model: GpuModel, memory_mib: int | None = None) -> int:
        """The most usable whole GPUs of ``model`` (of at least ``memory_mib``) that one node offers."""
        return max((_at_least(shape, memory_mib) for shape in self._whole.get(model, ())), default=0)

    def holds(self, model: GpuModel, ask: WorkerAsk) -> Status:
        """Whether the usable GPUs of ``model`` can hold ``ask``'s workers at once (module docstring)."""
        if ask.mig_profile is not None:
            return self._holds_mig(model, ask, ask.mig_profile)
        if ask.milli is not None:
            return self._holds_shared(model, ask, ask.milli)
        return self._holds_whole(model, ask)

    def _holds_whole(self, model: GpuModel, ask: WorkerAsk) -> Status:
        shapes = self._whole.get(model, Counter())
        details: dict[str, int | str] = {"gpu_type": model, "gpus_per_worker": ask.gpus}
        if not shapes:
            return _no_gpus(model, "whole", details)
        memory = ask.memory_mib
        largest_mib = max(shape[0] for shape in shapes)
        if memory is not None and largest_mib < memory:
            return Status.unresolvable(
                f"needs {memory} MiB per GPU; the largest {model} GPU has {largest_mib} MiB",
                plugin=NAME,
                code=ReasonCode.MEMORY,
                details={**details, "needed_mib": memory, "largest_mib": largest_mib},
            )
        largest = self.largest_node(model, memory)
        details["largest_node"] = largest
        if ask.gpus > largest:
            return Status.unresolvable(
                f"a worker needs {ask.gpus} {model} GPUs on one node; "
                f"the largest {model} node offers {largest}",
                plugin=NAME,
                code=ReasonCode.GANG_SIZE,
                details=details,
            )
        room = _room(shapes, ask.gpus, memory)
        if room < ask.workers:
            return _too_few(model, ask, room, f"workers of {ask.gpus} GPUs", details)
        if ask.within is None:
            return Status.success()
        level = ask.within
        if level is TopologyLevel.NODE:
            best = max(_room(Counter([shape]), ask.gpus, memory) for shape in shapes)
        else:
            best = self.roomiest_domain(model, level, ask.gpus, memory)
        if best < ask.workers:
            return Status.unresolvable(
                f"the gang needs {ask.workers} workers of {ask.gpus} GPUs in one {level.label} domain; "
                f"the roomiest {model} {level.label} domain holds {best}",
                plugin=NAME,
                code=ReasonCode.TOPOLOGY,
                details={**details, "workers": ask.workers, "level": level.label, "room": best},
            )
        return Status.success()

    def roomiest_domain(
        self, model: GpuModel, level: TopologyLevel, gpus: int, memory_mib: int | None
    ) -> int:
        """The most workers of ``gpus`` whole GPUs (of at least ``memory_mib``) one domain at ``level``
        (NVLink domain, leaf, spine) holds."""
        key = (model, level, gpus, memory_mib)
        found = self._room.get(key)
        if found is None:
            domains = self._domains.get((model, level), {})
            found = self._room[key] = max((_room(d, gpus, memory_mib) for d in domains.values()), default=0)
        return found

    def _holds_mig(self, model: GpuModel, ask: WorkerAsk, name: str) -> Status:
        details: dict[str, int | str] = {"gpu_type": model, "mig_profile": name}
        gpus = _usable(self._mig.get(model, Counter()), ask.memory_mib)
        geometry = mig_geometry(model)
        if not gpus or geometry is None:
            return _no_gpus(model, "MIG-mode", details)
        profile = geometry.profile(name)
        if profile is None:
            offered = ", ".join(p.name for p in geometry.profiles)
            return Status.unresolvable(
                f"{model} does not offer MIG profile {name} (it offers {offered})",
                plugin=NAME,
                code=ReasonCode.MIG_PROFILE,
                details=details,
            )
        room = gpus * instances_per_gpu(geometry, profile)
        if room < ask.workers:
            return _too_few(model, ask, room, f"{name} slices", details)
        return Status.success()

    def _holds_shared(self, model: GpuModel, ask: WorkerAsk, milli: int) -> Status:
        details: dict[str, int | str] = {"gpu_type": model, "milli": milli}
        gpus = _usable(self._shared.get(model, Counter()), ask.memory_mib)
        if not gpus:
            return _no_gpus(model, "shared", details, code=ReasonCode.FRACTION)
        room = gpus * (FULL_GPU_MILLI // milli)
        if room < ask.workers:
            return _too_few(model, ask, room, f"workers of {milli} milli-GPU", details)
        return Status.success()


def _bump(table: dict[G, Counter[K]], group: G, key: K, delta: int) -> None:
    counts = table.setdefault(group, Counter())
    counts[key] += delta
    if counts[key] <= 0:
        del counts[key]
        if not counts:
            del table[group]


def _room(shapes: Counter[tuple[MiB, ...]], gpus: int, memory_mib: int | None) -> int:
    """How many workers of ``gpus`` GPUs (of at least ``memory_mib``) nodes of these shapes hold."""
    return sum(nodes * (_at_least(shape, memory_mib) // gpus) for shape, nodes in shapes.items())


def _at_least(shape: tuple[MiB, ...], memory_mib: int | None) -> int:
    """How many GPUs of a node shape (memories, largest first) have at least ``memory_mib``."""
    if memory_mib is None:
        return len(shape)
    return sum(1 for m in shape if m >= memory_mib)


def _usable(gpus: Counter[MiB], memory_mib: int | None) -> int:
    return sum(n for m, n in gpus.items() if memory_mib is None or m >= memory_mib)


def _no_gpus(
    model: GpuModel,
    mode: str,
    details: dict[str, int | str],
    *,
    code: ReasonCode = ReasonCode.GPU_TYPE,
) -> Status:
    return Status.unresolvable(
        f"no node offers a usable {model} GPU in {mode} mode (of the memory asked)",
        plugin=NAME,
        code=code,
        details={**details, "largest_node": 0},
    )


def _too_few(model: GpuModel, ask: WorkerAsk, room: int, what: str, details: dict[str, int | str]) -> Status:
    return Status.unresolvable(
        f"the gang needs {ask.workers} {what} at once; the usable {model} GPUs hold {room}",
        plugin=NAME,
        code=ReasonCode.GANG_SIZE,
        details={**details, "workers": ask.workers, "room": room},
    )
