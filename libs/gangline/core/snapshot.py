"""The indexed cluster state one scheduling cycle works on.

`Snapshot` holds the cluster (nodes, GPUs, topology, health) and what is running on it, indexed
with integers so the questions placement asks are cheap:

* free whole GPUs per node and per GPU model, and the nodes *bucketed by that count* (one sorted
  list of node indexes per count), so "the fullest node with >= 2 free H100s" is a bucket walk,
  not a scan of 10,000 nodes;
* free whole GPUs aggregated per NVLink domain, leaf and spine, so a topology-required gang looks
  at domains by aggregate first and only opens the few that can hold it;
* MIG occupancy as an 8-bit memory-slice mask per GPU, and milli used per shared GPU.

A node the core cannot model is left out, with the reason, in `refused` (nothing raises for one bad
node): its own hardware (`node_problem`: a MIG GPU of a model with no known geometry, an impossible
carved layout), a node id seen before, or topology labels that contradict the nodes before it (an
NVLink domain under two leaves, a leaf under two spines; the first node in index order stands).

Node indexes follow (spine, leaf, NVLink domain, node id), so neighbours have neighbouring
indexes; every tie is broken by index, which makes every answer deterministic.

Ownership and mutation: one writer owns a snapshot. Between cycles it applies what the log says
(`grant`, `release`, `cordon`, `set_gpu_health`, `apply_plan`), each O(change). A cycle works
inside `transaction()`: every change made there (reservations, what-if releases for preemption)
is journaled and undone when the transaction closes, so the snapshot handed to a cycle comes back
exactly as it was. `savepoint()` / `rollback_to()` nest inside a transaction.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from gangline.core.framework.status import Status
from gangline.core.mig import MigGeometry, MigProfile
from gangline.core.model import (
    FULL_GPU_MILLI,
    Allocation,
    DomainId,
    Gpu,
    GpuId,
    GpuMode,
    GpuModel,
    Job,
    JobId,
    MigSlot,
    Milli,
    Node,
    NodeId,
    QueueName,
    TopologyLevel,
    WorkerPlacement,
)
from gangline.core.queues import Resource, gpu_resource, job_request

NAME = "snapshot"

_VERSIONS = itertools.count()
"""`Snapshot.version`s, unique in the process."""


def most_over(values: Sequence[int], models: Sequence[int]) -> int:
    """The largest of `values` at the indexes `models` (0 when there are none); one model, the
    common case, without building a generator (pre-filters ask this for every job, every cycle)."""
    if len(models) == 1:
        return values[models[0]]
    return max((values[m] for m in models), default=0)


def node_problem(node: Node) -> str | None:
    """Why the core cannot model `node`'s own hardware, or None when it can (pure, per node)."""
    for g in node.gpus:
        why = g.mig_problem()
        if why is not None:
            return why
    return None


# levels that aggregate several nodes; NODE is the node itself
DOMAIN_LEVELS: tuple[TopologyLevel, ...] = (TopologyLevel.NVLINK, TopologyLevel.LEAF, TopologyLevel.SPINE)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs, with the allocation it holds."""

    job: Job
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class Slot:
    """One worker's resources by snapshot index: a node, its GPUs, and a MIG slot / milli share.

    `gpus` are global GPU indexes (see `Snapshot.gpu`). Candidates and reservations use slots;
    `Snapshot.placement_of` turns them into wire `WorkerPlacement`s.
    """

    node: int
    gpus: tuple[int, ...]
    mig: MigSlot | None = None
    milli: int | None = None


class Snapshot:
    """Indexed cluster state; see the module docstring for the ownership contract."""

    # ---------------------------------------------------------------- construction

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.refused: dict[NodeId, str] = {}
        """Nodes left out, with why (see the module docstring)."""
        ordered = self._modelled(sorted(nodes, key=lambda n: (n.spine, n.leaf, n.domain, n.id)))
        self.nodes: tuple[Node, ...] = tuple(ordered)
        self.node_pos: dict[NodeId, int] = {n.id: i for i, n in enumerate(self.nodes)}
        self.models: tuple[GpuModel, ...] = tuple(sorted({g.model for n in ordered for g in n.gpus}))
        self.model_pos: dict[GpuModel, int] = {m: k for k, m in enumerate(self.models)}
        self.model_memory: list[int] = [0] * len(self.models)
        n_nodes, n_models = len(self.nodes), len(self.models)

        # domains per level
        self.dom_of: dict[TopologyLevel, list[int]] = {}
        self.dom_names: dict[TopologyLevel, list[DomainId]] = {}
        self.dom_members: dict[TopologyLevel, list[list[int]]] = {}
        for lvl in DOMAIN_LEVELS:
            names: dict[DomainId, int] = {}
            of: list[int] = []
            members: list[list[int]] = []
            for i, n in enumerate(self.nodes):
                label = self._label(n, lvl)
                d = names.get(label)
                if d is None:
                    d = names[label] = len(members)
                    members.append([])
                of.append(d)
                members[d].append(i)
            self.dom_of[lvl] = of
            self.dom_names[lvl] = list(names)
            self.dom_members[lvl] = members
        self.nvlink_is_node = len(self.dom_members[TopologyLevel.NVLINK]) == n_nodes

        # GPUs
        self.gpus: list[Gpu] = []
        self.gpu_pos: dict[GpuId, int] = {}
        self.g_node: list[int] = []
        self.g_model: list[int] = []
        self.g_healthy: list[bool] = []
        self.g_usable: list[bool] = []
        self.g_owner: list[JobId | None] = []
        self.g_geometry: list[MigGeometry | None] = []
        self.g_mig_mask: list[int] = []
        self.g_mig_compute: list[int] = []
        self.g_mig: dict[int, dict[int, tuple[MigProfile, JobId]]] = {}
        self.g_milli_used: list[int] = []
        self.g_milli: dict[int, dict[JobId, int]] = {}
        self.node_gpus: list[tuple[int, ...]] = []
        self.node_cordoned: list[bool] = [n.cordoned for n in self.nodes]
        self.node_max_whole: list[int] = [0] * n_nodes
        self.mig_nodes: list[list[int]] = [[] for _ in range(n_models)]
        self.shared_nodes: list[list[int]] = [[] for _ in range(n_models)]

        self.free: list[list[int]] = [[0] * n_nodes for _ in range(n_models)]
        self.capacity: list[int] = [0] * n_models  # whole-mode GPUs of each model, any health
        self.total_free: list[int] = [0] * n_models
        self.free_unusable: list[int] = [0] * n_models
        self.dom_free: dict[TopologyLevel, list[list[int]]] = {
            lvl: [[0] * len(self.dom_members[lvl]) for _ in range(n_models)] for lvl in DOMAIN_LEVELS
        }
        self.dom_capacity: dict[TopologyLevel, list[list[int]]] = {
            lvl: [[0] * len(self.dom_members[lvl]) for _ in range(n_models)] for lvl in DOMAIN_LEVELS
        }
        for i, n in enumerate(self.nodes):
            idxs: list[int] = []
            whole = 0
            for g in sorted(n.gpus, key=lambda g: (g.index, g.id)):
                k = len(self.gpus)
                m = self.model_pos[g.model]
                self.model_memory[m] = max(self.model_memory[m], g.memory_mib)
                self.gpus.append(g)
                self.gpu_pos[g.id] = k
                self.g_node.append(i)
                self.g_model.append(m)
                self.g_healthy.append(g.healthy)
                usable = g.healthy and not n.cordoned
                self.g_usable.append(usable)
                self.g_owner.append(None)
                self.g_geometry.append(g.mig)
                self.g_mig_mask.append(0)
                self.g_mig_compute.append(0)
                self.g_milli_used.append(0)
                idxs.append(k)
                if g.mode is GpuMode.WHOLE:
                    whole += 1
                    self.capacity[m] += 1
                    for lvl in DOMAIN_LEVELS:
                        self.dom_capacity[lvl][m][self.dom_of[lvl][i]] += 1
                    if usable:
                        self.free[m][i] += 1
                        self.total_free[m] += 1
                        for lvl in DOMAIN_LEVELS:
                            self.dom_free[lvl][m][self.dom_of[lvl][i]] += 1
                    else:
                        self.free_unusable[m] += 1
                elif g.mode is GpuMode.MIG:
                    if not self.mig_nodes[m] or self.mig_nodes[m][-1] != i:
                        self.mig_nodes[m].append(i)
                elif not self.shared_nodes[m] or self.shared_nodes[m][-1] != i:
                    self.shared_nodes[m].append(i)
            self.node_gpus.append(tuple(idxs))
            self.node_max_whole[i] = whole
        self.max_per_node = max(self.node_max_whole, default=0)
        # buckets[m][k]: sorted node indexes with exactly k free whole GPUs of model m (k >= 1)
        self.buckets: list[list[list[int]]] = [
            [[] for _ in range(self.max_per_node + 1)] for _ in range(n_models)
        ]
        for m in range(n_models):
            for i, f in enumerate(self.free[m]):
                if f:
                    self.buckets[m][f].append(i)
        self.running: dict[JobId, RunningJob] = {}
        self.preemptible_running = 0
        """How many of ``running`` are preemptible: none, and no action can find a victim."""
        self.queue_held: dict[QueueName, dict[Resource, int]] = {}
        """Per queue with jobs in ``running``: the quota they hold (:meth:`held_by`), summed per resource.
        Kept as jobs start and end, so a cycle's ledger is not a walk over every running job."""
        self.queue_running: dict[QueueName, int] = {}
        """How many running jobs each queue has (queues with none are absent)."""
        self._held_by_how_many: dict[QueueName, dict[Resource, int]] = {}
        """Per queue and resource: how many running jobs hold some (a resource none holds is left out)."""
        self.version = next(_VERSIONS)
        """Renewed by every change made outside a transaction (a grant, a release, a cordon, a health
        change, a committed plan), from a count shared by every snapshot of the process, so no two
        states of any two snapshots have the same: what is computed from the committed snapshot alone
        may be kept, keyed on it, while it stands. Undoing a transaction brings its version back."""
        self._journal: list[tuple[object, ...]] | None = None

    def _modelled(self, ordered: Sequence[Node]) -> list[Node]:
        """The nodes the core can model, in order; the others go to `refused` with the reason."""
        kept: list[Node] = []
        ids: set[NodeId] = set()
        gpu_ids: set[GpuId] = set()
        parent: dict[TopologyLevel, dict[DomainId, DomainId]] = {lvl: {} for lvl in DOMAIN_LEVELS}
        for n in ordered:
            why = node_problem(n)
            if why is None and n.id in ids:
                why = f"node id {n.id} is registered twice"
            if why is None:
                why = next((f"GPU id {g.id} is used twice" for g in n.gpus if g.id in gpu_ids), None)
            if why is None:
                for lvl in DOMAIN_LEVELS[:-1]:
                    label, up = self._label(n, lvl), self._label(n, TopologyLevel(lvl + 1))
                    seen = parent[lvl].get(label, up)
                    if seen != up:
                        upper = TopologyLevel(lvl + 1).label
                        why = f"{lvl.label} domain {label} is in {upper} {seen}; node {n.id} puts it in {up}"
                        break
            if why is not None:
                self.refused.setdefault(n.id, why)
                continue
            for lvl in DOMAIN_LEVELS[:-1]:
                parent[lvl].setdefault(self._label(n, lvl), self._label(n, TopologyLevel(lvl + 1)))
            ids.add(n.id)
            gpu_ids.update(g.id for g in n.gpus)
            kept.append(n)
        return kept

    @staticmethod
    def _label(n: Node, lvl: TopologyLevel) -> DomainId:
        if lvl is TopologyLevel.NVLINK:
            return n.domain
        if lvl is TopologyLevel.LEAF:
            return n.leaf
        if lvl is TopologyLevel.SPINE:
            return n.spine
        return DomainId(n.id)

    @classmethod
    def build(cls, nodes: Sequence[Node], running: Sequence[RunningJob] = ()) -> Snapshot:
        """A snapshot of `nodes` with `running` jobs granted (in job-id order)."""
        snap = cls(nodes)
        for r in sorted(running, key=lambda r: r.job.id):
            status = snap.grant(r.job, r.allocation)
            if not status.ok:
                raise ValueError(status.message)
        return snap

    def copy(self) -> Snapshot:
        """An independent deep copy with the same cluster, health and running jobs."""
        nodes = [
            Node(
                id=n.id,
                gpus=tuple(replace(g, healthy=self.g_healthy[self.gpu_pos[g.id]]) for g in n.gpus),
                leaf=n.leaf,
                spine=n.spine,
                nvlink_domain=n.nvlink_domain,
                cordoned=self.node_cordoned[i],
            )
            for i, n in enumerate(self.nodes)
        ]
        return Snapshot.build(nodes, list(self.running.values()))

    # ---------------------------------------------------------------- transactions

    @contextmanager
    def transaction(self) -> Iterator[Snapshot]:
        """Journal every change made inside; undo all of them on exit (even on error)."""
        if self._journal is not None:
            raise RuntimeError("snapshot transactions do not nest; use savepoint()")
        self._journal = []
        try:
            yield self
        finally:
            self.rollback_to(0)
            self._journal = None

    def savepoint(self) -> int:
        """A mark to `rollback_to` inside the open transaction."""
        if self._journal is None:
            raise RuntimeError("savepoint() needs an open transaction")
        return len(self._journal)

    def rollback_to(self, mark: int) -> None:
        """Undo, newest first, every change made after `mark`."""
        journal = self._journal
        if journal is None:
            raise RuntimeError("rollback_to() needs an open transaction")
        self._journal = None  # undo without journaling
        version = self.version  # an undo brings back a state of this version: it is no change
        try:
            while len(journal) > mark:
                entry = journal.pop()
                op = entry[0]
                if op == "o":
                    self._set_owner(entry[1], entry[2])  # type: ignore[arg-type]
                elif op == "u":
                    self._set_usable(entry[1], entry[2])  # type: ignore[arg-type]
                elif op == "c":
                    self.node_cordoned[entry[1]] = entry[2]  # type: ignore[call-overload]
                elif op == "h":
                    self.g_healthy[entry[1]] = entry[2]  # type: ignore[call-overload]
                elif op == "m":
                    self._set_mig(entry[1], entry[2], entry[3])  # type: ignore[arg-type]
                elif op == "s":
                    self._set_milli(entry[1], entry[2], entry[3])  # type: ignore[arg-type]
                elif op == "r":
                    self._set_running(entry[1], entry[2])  # type: ignore[arg-type]
        finally:
            self._journal = journal
            self.version = version

    @property
    def in_transaction(self) -> bool:
        """Whether changes are being journaled for undo."""
        return self._journal is not None

    # ---------------------------------------------------------------- primitive changes

    def _adjust_free(self, i: int, m: int, delta: int) -> None:
        free = self.free[m]
        old = free[i]
        new = old + delta
        buckets = self.buckets[m]
        if old:
            b = buckets[old]
            del b[bisect_left(b, i)]
        if new:
            insort(buckets[new], i)
        free[i] = new
        self.total_free[m] += delta
        for lvl in DOMAIN_LEVELS:
            self.dom_free[lvl][m][self.dom_of[lvl][i]] += delta

    def _set_owner(self, g: int, owner: JobId | None) -> None:
        old = self.g_owner[g]
        if self._journal is not None:
            self._journal.append(("o", g, old))
        else:
            self.version = next(_VERSIONS)
        self.g_owner[g] = owner
        if (old is None) == (owner is None) or self.gpus[g].mode is not GpuMode.WHOLE:
            return
        delta = 1 if owner is None else -1
        if self.g_usable[g]:
            self._adjust_free(self.g_node[g], self.g_model[g], delta)
        else:
            self.free_unusable[self.g_model[g]] += delta

    def _set_usable(self, g: int, usable: bool) -> None:
        old = self.g_usable[g]
        if old == usable:
            return
        if self._journal is not None:
            self._journal.append(("u", g, old))
        else:
            self.version = next(_VERSIONS)
        self.g_usable[g] = usable
        if self.g_owner[g] is None and self.gpus[g].mode is GpuMode.WHOLE:
            m = self.g_model[g]
            self._adjust_free(self.g_node[g], m, 1 if usable else -1)
            self.free_unusable[m] += -1 if usable else 1

    def _set_mig(self, g: int, start: int, entry: tuple[MigProfile, JobId] | None) -> None:
        inst = self.g_mig.setdefault(g, {})
        old = inst.get(start)
        if self._journal is not None:
            self._journal.append(("m", g, start, old))
        else:
            self.version = next(_VERSIONS)
        if old is not None:
            self.g_mig_mask[g] &= ~old[0].mask_at(start)
            self.g_mig_compute[g] -= old[0].compute
            del inst[start]
        if entry is not None:
            self.g_mig_mask[g] |= entry[0].mask_at(start)
            self.g_mig_compute[g] += entry[0].compute
            inst[start] = entry

    def _set_milli(self, g: int, job: JobId, milli: int | None) -> None:
        shares = self.g_milli.setdefault(g, {})
        old = shares.get(job)
        if self._journal is not None:
            self._journal.append(("s", g, job, old))
        else:
            self.version = next(_VERSIONS)
        if old is not None:
            self.g_milli_used[g] -= old
            del shares[job]
        if milli is not None:
            self.g_milli_used[g] += milli
            shares[job] = milli

    def _set_running(self, job_id: JobId, entry: RunningJob | None) -> None:
        old = self.running.get(job_id)
        if self._journal is not None:
            self._journal.append(("r", job_id, old))
        else:
            self.version = next(_VERSIONS)
        if old is not None:
            self._count_held(old, -1)
            if old.job.preemptible:
                self.preemptible_running -= 1
        if entry is None:
            self.running.pop(job_id, None)
        else:
            self.running[job_id] = entry
            self._count_held(entry, 1)
            if entry.job.preemptible:
                self.preemptible_running += 1

    def held_by(self, running: RunningJob) -> dict[Resource, int]:
        """The quota a running job holds: its model (from its first GPU) and its placed worker count."""
        placements = running.allocation.placements
        if not placements or not placements[0].gpus:
            return {}
        model = self.models[self.g_model[self.gpu_pos[placements[0].gpus[0]]]]
        job = running.job
        if job.mig_profile is None and job.gpu_milli is None:
            return {gpu_resource(model): len(placements) * job.gpus_per_worker}
        return job_request(job, GpuModel(model), len(placements))

    def _count_held(self, running: RunningJob, sign: int) -> None:
        """Add (``sign`` 1) or take back (-1) what ``running`` holds in ``queue_held``."""
        queue = running.job.queue
        jobs = self.queue_running.get(queue, 0) + sign
        held = self.queue_held.setdefault(queue, {})
        holders = self._held_by_how_many.setdefault(queue, {})
        for resource, n in self.held_by(running).items():
            count = holders.get(resource, 0) + sign
            if count:
                holders[resource] = count
                held[resource] = held.get(resource, 0) + sign * n
            else:
                del holders[resource], held[resource]
        if jobs:
            self.queue_running[queue] = jobs
        else:
            del self.queue_running[queue], self.queue_held[queue], self._held_by_how_many[queue]

    # ---------------------------------------------------------------- reserving slots

    def record_running(self, job: Job, allocation: Allocation) -> None:
        """Note that `job` holds `allocation` (its slots were taken with `take`)."""
        self._set_running(job.id, RunningJob(job, allocation))

    def slot_conflict(self, job: Job, slot: Slot) -> str | None:
        """Why `slot` cannot be taken by `job` now, or None when it can."""
        if not 0 <= slot.node < len(self.nodes):
            return f"no node #{slot.node}"
        for g in slot.gpus:
            if self.g_node[g] != slot.node:
                return f"GPU {self.gpus[g].id} is not on node {self.nodes[slot.node].id}"
            gpu = self.gpus[g]
            if slot.mig is not None:
                geo = self.g_geometry[g]
                prof = geo.profile(slot.mig.profile) if geo is not None else None
                if geo is None or prof is None:
                    return f"GPU {gpu.id} does not offer MIG profile {slot.mig.profile}"
                if slot.mig.start not in prof.starts:
                    return f"MIG profile {prof.name} cannot start at slice {slot.mig.start}"
                if slot.mig.start not in geo.free_starts(prof, self.g_mig_mask[g], self.g_mig_compute[g]):
                    return f"MIG slices of {prof.name}@{slot.mig.start} on GPU {gpu.id} are taken"
            elif slot.milli is not None:
                if gpu.mode is not GpuMode.SHARED:
                    return f"GPU {gpu.id} is not shared"
                if job.id in self.g_milli.get(g, {}):
                    return f"job {job.id} already holds a share of GPU {gpu.id}"
                if self.g_milli_used[g] + slot.milli > FULL_GPU_MILLI:
                    return f"GPU {gpu.id} has {FULL_GPU_MILLI - self.g_milli_used[g]} milli free"
            else:
                if gpu.mode is not GpuMode.WHOLE:
                    return f"GPU {gpu.id} is in {gpu.mode} mode"
                if self.g_owner[g] is not None:
                    return f"GPU {gpu.id} is held by {self.g_owner[g]}"
        if slot.mig is None and slot.milli is None and len(set(slot.gpus)) != len(slot.gpus):
            return "a GPU is listed twice"
        return None

    def take(self, job: Job, slot: Slot) -> None:
        """Give `slot` to `job` (no checks: callers check with `slot_conflict` first)."""
        if slot.mig is not None:
            g = slot.gpus[0]
            geo = self.g_geometry[g]
            assert geo is not None
            prof = geo.profile(slot.mig.profile)
            assert prof is not None
            self._set_mig(g, slot.mig.start, (prof, job.id))
        elif slot.milli is not None:
            self._set_milli(slot.gpus[0], job.id, slot.milli)
        else:
            for g in slot.gpus:
                self._set_owner(g, job.id)

    def give_back(self, job_id: JobId, slot: Slot) -> None:
        """Return `slot`, held by `job_id`, to the free pool."""
        if slot.mig is not None:
            self._set_mig(slot.gpus[0], slot.mig.start, None)
        elif slot.milli is not None:
            self._set_milli(slot.gpus[0], job_id, None)
        else:
            for g in slot.gpus:
                if self.g_owner[g] == job_id:
                    self._set_owner(g, None)

    # ---------------------------------------------------------------- committed changes

    def slots_of(self, allocation: Allocation) -> list[Slot] | str:
        """The allocation's placements as slots, or why they name unknown nodes/GPUs."""
        slots: list[Slot] = []
        for p in allocation.placements:
            i = self.node_pos.get(p.node)
            if i is None:
                return f"unknown node {p.node}"
            gs: list[int] = []
            for gid in p.gpus:
                g = self.gpu_pos.get(gid)
                if g is None:
                    return f"unknown GPU {gid}"
                gs.append(g)
            if (p.mig is not None or p.milli is not None) and len(gs) != 1:
                return f"rank {p.rank}: a MIG slot or share names exactly one GPU"
            slots.append(Slot(i, tuple(gs), p.mig, p.milli))
        return slots

    def grant(self, job: Job, allocation: Allocation) -> Status:
        """Record that `job` holds `allocation`; all-or-nothing, refused with a reason on conflict."""
        if job.id in self.running:
            return Status.error(f"job {job.id} already holds an allocation", plugin=NAME)
        slots = self.slots_of(allocation)
        if isinstance(slots, str):
            return Status.error(slots, plugin=NAME)
        done: list[Slot] = []
        for s in slots:
            why = self.slot_conflict(job, s)
            if why is not None:
                for d in reversed(done):
                    self.give_back(job.id, d)
                return Status.error(f"cannot grant {allocation.id}: {why}", plugin=NAME)
            self.take(job, s)
            done.append(s)
        self._set_running(job.id, RunningJob(job, allocation))
        return Status.success()

    def release(self, job_id: JobId) -> RunningJob | None:
        """Free everything `job_id` holds; the released job, or None when it held nothing."""
        r = self.running.get(job_id)
        if r is None:
            return None
        slots = self.slots_of(r.allocation)
        assert not isinstance(slots, str)
        for s in slots:
            self.give_back(job_id, s)
        self._set_running(job_id, None)
        return r

    def cordon(self, node: NodeId, cordoned: bool = True) -> None:
        """Mark a node (un)schedulable; running work stays until released."""
        i = self.node_pos[node]
        if self.node_cordoned[i] == cordoned:
            return
        if self._journal is not None:
            self._journal.append(("c", i, self.node_cordoned[i]))
        else:
            self.version = next(_VERSIONS)
        self.node_cordoned[i] = cordoned
        for g in self.node_gpus[i]:
            self._set_usable(g, self.g_healthy[g] and not cordoned)

    def set_gpu_health(self, gpu: GpuId, healthy: bool) -> None:
        """Mark a GPU (un)healthy; an unhealthy GPU is never offered."""
        g = self.gpu_pos[gpu]
        if self.g_healthy[g] == healthy:
            return
        if self._journal is not None:
            self._journal.append(("h", g, self.g_healthy[g]))
        else:
            self.version = next(_VERSIONS)
        self.g_healthy[g] = healthy
        self._set_usable(g, healthy and not self.node_cordoned[self.g_node[g]])

    # ---------------------------------------------------------------- queries

    def placement_of(self, rank: int, slot: Slot) -> WorkerPlacement:
        """The wire form of a slot."""
        milli = Milli(slot.milli) if slot.milli is not None else None
        mig = slot.mig
        if mig is not None:
            layout = self.gpus[slot.gpus[0]].mig_layout or ()
            # the carved instance at that position, which carries the ids the node knows it by
            mig = next((c for c in layout if c == mig), mig)
        return WorkerPlacement(
            rank=rank,
            node=self.nodes[slot.node].id,
            gpus=tuple(self.gpus[g].id for g in slot.gpus),
            mig=mig,
            milli=milli,
        )

    def domain_of(self, level: TopologyLevel, node: int) -> int:
        """The index of the node's domain at `level` (the node index itself at NODE)."""
        return node if level is TopologyLevel.NODE else self.dom_of[level][node]

    def domain_name(self, level: TopologyLevel, d: int) -> DomainId:
        """The label of domain `d` at `level`."""
        return DomainId(self.nodes[d].id) if level is TopologyLevel.NODE else self.dom_names[level][d]

    def domain_count(self, level: TopologyLevel) -> int:
        """How many domains exist at `level`."""
        return len(self.nodes) if level is TopologyLevel.NODE else len(self.dom_members[level])

    def members(self, level: TopologyLevel, d: int) -> Sequence[int]:
        """Node indexes of domain `d` at `level`, in index order."""
        return (d,) if level is TopologyLevel.NODE else self.dom_members[level][d]

    def free_in_domain(self, level: TopologyLevel, m: int, d: int) -> int:
        """Free usable whole GPUs of model `m` in domain `d` at `level`."""
        return self.free[m][d] if level is TopologyLevel.NODE else self.dom_free[level][m][d]

    def capacity_of_domain(self, level: TopologyLevel, m: int, d: int) -> int:
        """Whole GPUs of model `m` in domain `d`, whatever their state."""
        if level is TopologyLevel.NODE:
            return sum(
                1 for g in self.node_gpus[d] if self.g_model[g] == m and self.gpus[g].mode is GpuMode.WHOLE
            )
        return self.dom_capacity[level][m][d]

    def largest_free_domain(self, level: TopologyLevel, m: int) -> int:
        """The most free whole GPUs of model `m` found in one domain at `level`."""
        if level is TopologyLevel.NODE or (level is TopologyLevel.NVLINK and self.nvlink_is_node):
            b = self.buckets[m]
            for k in range(len(b) - 1, 0, -1):
                if b[k]:
                    return k
            return 0
        return max(self.dom_free[level][m], default=0)

    def domains_with_free(self, level: TopologyLevel, m: int, need: int) -> list[int]:
        """Domains at `level` with >= `need` free GPUs of model `m`, fullest first (best fit).

        Ordered by (free ascending, index): the tightest domain that can hold the request comes
        first, which keeps emptier domains whole for bigger gangs.
        """
        if level is TopologyLevel.NODE or (level is TopologyLevel.NVLINK and self.nvlink_is_node):
            out: list[int] = []
            b = self.buckets[m]
            for k in range(max(need, 1), len(b)):
                out.extend(b[k])
            if level is TopologyLevel.NVLINK:
                out = [self.dom_of[TopologyLevel.NVLINK][i] for i in out]
            return out
        free = self.dom_free[level][m]
        hits = [d for d, f in enumerate(free) if f >= need]
        hits.sort(key=lambda d: (free[d], d))
        return hits

    def free_whole_gpus(self, i: int, m: int) -> list[int]:
        """Free usable whole GPUs of model `m` on node `i`, by GPU index."""
        owner, usable, model = self.g_owner, self.g_usable, self.g_model
        return [
            g
            for g in self.node_gpus[i]
            if owner[g] is None and usable[g] and model[g] == m and self.gpus[g].mode is GpuMode.WHOLE
        ]

    def allocation_count(self) -> int:
        """How many jobs hold GPUs."""
        return len(self.running)

    def check_invariants(self) -> list[str]:
        """Recompute every index from GPU state and list disagreements (tests and audits)."""
        problems: list[str] = []
        for m in range(len(self.models)):
            for i in range(len(self.nodes)):
                want = len(self.free_whole_gpus(i, m))
                if self.free[m][i] != want:
                    problems.append(f"free[{self.models[m]}][{self.nodes[i].id}]={self.free[m][i]} != {want}")
                if want and i not in self.buckets[m][want]:
                    problems.append(f"node {self.nodes[i].id} missing from bucket {want}")
            for k, b in enumerate(self.buckets[m]):
                if b != sorted(b) or any(self.free[m][i] != k for i in b):
                    problems.append(f"bucket {self.models[m]}/{k} stale")
            if self.total_free[m] != sum(self.free[m]):
                problems.append(f"total_free[{self.models[m]}] stale")
            for lvl in DOMAIN_LEVELS:
                for d, members in enumerate(self.dom_members[lvl]):
                    if self.dom_free[lvl][m][d] != sum(self.free[m][i] for i in members):
                        problems.append(f"dom_free[{lvl.label}][{d}] stale")
        for g, geo in enumerate(self.g_geometry):
            if geo is None:
                continue
            mask = 0
            for start, (prof, _) in self.g_mig.get(g, {}).items():
                if mask & prof.mask_at(start):
                    problems.append(f"GPU {self.gpus[g].id}: MIG instances overlap")
                mask |= prof.mask_at(start)
            if mask != self.g_mig_mask[g]:
                problems.append(f"GPU {self.gpus[g].id}: MIG mask stale")
        for g, used in enumerate(self.g_milli_used):
            if used != sum(self.g_milli.get(g, {}).values()) or used > FULL_GPU_MILLI:
                problems.append(f"GPU {self.gpus[g].id}: milli accounting wrong ({used})")
        preemptible = sum(1 for r in self.running.values() if r.job.preemptible)
        if self.preemptible_running != preemptible:
            problems.append(f"preemptible_running={self.preemptible_running} != {preemptible}")
        held: dict[QueueName, dict[Resource, int]] = {}
        for r in self.running.values():
            vec = held.setdefault(r.job.queue, {})
            for resource, n in self.held_by(r).items():
                vec[resource] = vec.get(resource, 0) + n
        if self.queue_held != held:
            problems.append(f"queue_held={self.queue_held} != {held} (what the running jobs hold)")
        return problems


class NodeView:
    """Read-only view of one node for filter plugins (cheap: a snapshot and an index)."""

    __slots__ = ("index", "snapshot")

    def __init__(self, snapshot: Snapshot, index: int) -> None:
        self.snapshot = snapshot
        self.index = index

    @property
    def node(self) -> Node:
        """The node as registered."""
        return self.snapshot.nodes[self.index]

    @property
    def id(self) -> NodeId:
        """The node id."""
        return self.snapshot.nodes[self.index].id

    @property
    def cordoned(self) -> bool:
        """Whether the node takes no new work."""
        return self.snapshot.node_cordoned[self.index]

    def free_whole(self, model: int) -> int:
        """Free usable whole GPUs of model index `model`."""
        return self.snapshot.free[model][self.index]

    def unhealthy_gpus(self) -> int:
        """GPUs on this node marked unhealthy."""
        s = self.snapshot
        return sum(1 for g in s.node_gpus[self.index] if not s.g_healthy[g])

    def domain(self, level: TopologyLevel) -> int:
        """The node's domain index at `level`."""
        return self.snapshot.domain_of(level, self.index)
