"""Queues, cohorts and quota accounting: may this job run within its queue's quota plus what it may borrow?

Each team owns a queue with a nominal quota per resource (a GPU type, or a MIG profile of a GPU type),
an optional borrowing limit (how far beyond its nominal quota it may go) and an optional lending limit
(how much of its idle nominal quota it lends to its cohort). Queues form cohorts, and cohorts may nest
into parent cohorts; a cohort may also hold quota of its own that all its members share.

The accounting follows Kueue's hierarchical cohorts. For every node of the tree (queue or cohort) and
resource:

- ``subtree_quota`` = own nominal + what each child puts at the cohort's disposal
  (``child.subtree_quota - child.guaranteed``);
- ``guaranteed`` = the part of ``subtree_quota`` the node keeps for itself and never lends
  (``subtree_quota - lending_limit`` when a lending limit is set, else nothing);
- ``usage`` of a queue is its admitted work; ``usage`` of a cohort is what its children use beyond
  their guaranteed parts;
- ``available`` = what the node may still take: its unused guaranteed part plus what its parent has
  available, capped by its borrowing limit.

The ledger is the only mutable thing here: a cycle copies it, admits into the copy, and throws it
away or keeps it. Everything is integers, so there is no rounding drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NewType

from gangline.core.model import GpuMode, GpuModel, Job, QueueName

__all__ = [
    "SHARED_SUFFIX",
    "UNLIMITED",
    "CohortName",
    "CohortSpec",
    "QueueName",
    "QueueSpec",
    "QuotaCheck",
    "QuotaConfigError",
    "QuotaLedger",
    "QuotaTree",
    "Resource",
    "ResourceQuota",
    "ResourceVector",
    "gpu_resource",
    "job_request",
    "mig_resource",
]

CohortName = NewType("CohortName", str)
Resource = NewType("Resource", str)
"""A countable quota unit: a whole-GPU type (``H100``) or a MIG profile of one (``A100/1g.10gb``)."""

ResourceVector = Mapping[Resource, int]

MIG_SEPARATOR = "/"

UNLIMITED = 1 << 62
"""What an unlimited queue may still be admitted, of any resource: more than any cluster holds."""


def gpu_resource(gpu_type: str) -> Resource:
    """The quota resource for whole GPUs of ``gpu_type``."""
    return Resource(gpu_type)


def mig_resource(gpu_type: str, profile: str) -> Resource:
    """The quota resource for MIG slices of ``profile`` on GPUs of ``gpu_type``."""
    return Resource(f"{gpu_type}{MIG_SEPARATOR}{profile}")


SHARED_SUFFIX = "/milli"


def job_request(job: Job, model: GpuModel, workers: int | None = None) -> dict[Resource, int]:
    """The quota a job consumes on GPUs of ``model``: whole GPUs, MIG slices, or milli-GPUs.

    Whole GPUs count against ``<model>``, MIG workers against ``<model>/<profile>`` (one slice each)
    and fractional workers against ``<model>/milli`` in thousandths of a GPU.
    """
    n = job.workers if workers is None else workers
    if job.kind is GpuMode.MIG:
        assert job.mig_profile is not None
        return {mig_resource(model, job.mig_profile): n}
    if job.kind is GpuMode.SHARED:
        assert job.gpu_milli is not None
        return {Resource(f"{model}{SHARED_SUFFIX}"): n * job.gpu_milli}
    return {gpu_resource(model): n * job.gpus_per_worker}


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """Quota of one resource. ``None`` limits mean "no limit": borrow all the cohort has, lend all idle."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def __post_init__(self) -> None:
        if self.nominal < 0:
            raise ValueError(f"nominal quota must be >= 0, got {self.nominal}")
        if self.borrowing_limit is not None and self.borrowing_limit < 0:
            raise ValueError(f"borrowing limit must be >= 0, got {self.borrowing_limit}")
        if self.lending_limit is not None and self.lending_limit < 0:
            raise ValueError(f"lending limit must be >= 0, got {self.lending_limit}")


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A team's queue. ``weight`` scales its fair share: weight 2 is owed twice the share of weight 1."""

    name: QueueName
    quotas: Mapping[Resource, ResourceQuota] = field(default_factory=dict)
    cohort: CohortName | None = None
    weight: float = 1.0
    unlimited: bool = False
    """No quota: the queue may always be admitted what it asks (capacity is the only limit)."""

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"queue {self.name}: weight must be > 0, got {self.weight}")
        if self.unlimited and (self.quotas or self.cohort is not None):
            raise ValueError(f"queue {self.name}: an unlimited queue has no quotas and no cohort")


@dataclass(frozen=True, slots=True)
class CohortSpec:
    """A group of queues (and cohorts) that lend idle quota to each other; ``quotas`` is shared quota."""

    name: CohortName
    parent: CohortName | None = None
    quotas: Mapping[Resource, ResourceQuota] = field(default_factory=dict)


class QuotaConfigError(ValueError):
    """The queue/cohort configuration is inconsistent (unknown cohort, cycle, duplicate name)."""


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    """The answer to "may this request run now?": ``fits`` plus, when it does not, why, per resource."""

    fits: bool
    borrows: bool
    reasons: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


class _Node:
    __slots__ = (
        "borrowing_limit",
        "children",
        "depth",
        "guaranteed",
        "is_queue",
        "lending_limit",
        "name",
        "nominal",
        "parent",
        "subtree_quota",
        "unlimited",
    )

    def __init__(
        self, name: str, is_queue: bool, quotas: Mapping[Resource, ResourceQuota], unlimited: bool = False
    ) -> None:
        self.name = name
        self.is_queue = is_queue
        self.unlimited = unlimited
        self.parent: _Node | None = None
        self.children: list[_Node] = []
        self.depth = 0
        self.nominal: dict[Resource, int] = {r: q.nominal for r, q in quotas.items()}
        self.borrowing_limit: dict[Resource, int] = {
            r: q.borrowing_limit for r, q in quotas.items() if q.borrowing_limit is not None
        }
        self.lending_limit: dict[Resource, int] = {
            r: q.lending_limit for r, q in quotas.items() if q.lending_limit is not None
        }
        self.subtree_quota: dict[Resource, int] = {}
        self.guaranteed: dict[Resource, int] = {}


class QuotaTree:
    """The static shape: queues, cohorts and their quotas, with subtree quotas precomputed. Immutable."""

    def __init__(self, queues: Iterable[QueueSpec], cohorts: Iterable[CohortSpec] = ()) -> None:
        self._queues: dict[QueueName, _Node] = {}
        self._cohorts: dict[CohortName, _Node] = {}
        self._specs: dict[QueueName, QueueSpec] = {}
        cohort_specs = list(cohorts)
        for c in cohort_specs:
            if c.name in self._cohorts:
                raise QuotaConfigError(f"cohort {c.name} is defined twice")
            self._cohorts[c.name] = _Node(c.name, False, c.quotas)
        for q in queues:
            if q.name in self._queues:
                raise QuotaConfigError(f"queue {q.name} is defined twice")
            self._queues[q.name] = _Node(q.name, True, q.quotas, q.unlimited)
            self._specs[q.name] = q
        # Cohorts named only by their members exist implicitly, with no quota of their own.
        for q in self._specs.values():
            if q.cohort is not None and q.cohort not in self._cohorts:
                self._cohorts[q.cohort] = _Node(q.cohort, False, {})
        for c in cohort_specs:
            if c.parent is not None:
                if c.parent not in self._cohorts:
                    raise QuotaConfigError(f"cohort {c.name}: parent cohort {c.parent} is not defined")
                self._link(self._cohorts[c.name], self._cohorts[c.parent])
        for q in self._specs.values():
            if q.cohort is not None:
                self._link(self._queues[q.name], self._cohorts[q.cohort])
        for node in self._cohorts.values():
            self._check_acyclic(node)
        self.resources: frozenset[Resource] = frozenset(
            r for n in (*self._queues.values(), *self._cohorts.values()) for r in n.nominal
        )
        for root in self._roots():
            self._compute(root, 0)

    @staticmethod
    def _link(child: _Node, parent: _Node) -> None:
        child.parent = parent
        parent.children.append(child)

    @staticmethod
    def _check_acyclic(node: _Node) -> None:
        seen: set[int] = set()
        cur: _Node | None = node
        while cur is not None:
            if id(cur) in seen:
                raise QuotaConfigError(f"cohort {node.name} is part of a cycle of parent cohorts")
            seen.add(id(cur))
            cur = cur.parent

    def _roots(self) -> list[_Node]:
        return [n for n in (*self._cohorts.values(), *self._queues.values()) if n.parent is None]

    def _compute(self, node: _Node, depth: int) -> None:
        node.depth = depth
        for child in node.children:
            self._compute(child, depth + 1)
        for r in self.resources:
            total = node.nominal.get(r, 0)
            for child in node.children:
                total += child.subtree_quota[r] - child.guaranteed[r]
            node.subtree_quota[r] = total
            limit = node.lending_limit.get(r)
            node.guaranteed[r] = max(0, total - limit) if limit is not None else 0

    # ---- queries on the static shape ----

    def queue_names(self) -> list[QueueName]:
        return sorted(self._queues)

    def spec(self, queue: QueueName) -> QueueSpec:
        return self._specs[queue]

    def has_queue(self, queue: str) -> bool:
        return queue in self._queues

    def weight(self, queue: QueueName) -> float:
        return self._specs[queue].weight

    def nominal(self, queue: QueueName, resource: Resource) -> int:
        return self._queues[queue].nominal.get(resource, 0)

    def borrowing_limit(self, queue: QueueName, resource: Resource) -> int | None:
        return self._queues[queue].borrowing_limit.get(resource)

    def lending_limit(self, queue: QueueName, resource: Resource) -> int | None:
        return self._queues[queue].lending_limit.get(resource)

    def total_nominal(self, resource: Resource) -> int:
        """All quota of ``resource`` there is: every queue's and every cohort's own nominal quota."""
        return sum(n.nominal.get(resource, 0) for n in (*self._queues.values(), *self._cohorts.values()))

    def guaranteed(self, queue: QueueName, resource: Resource) -> int:
        """What the queue never lends: it can always run this much of ``resource`` without reclaiming."""
        return self._queues[queue].guaranteed.get(resource, 0)

    def cohort_of(self, queue: QueueName) -> CohortName | None:
        return self._specs[queue].cohort

    def root_cohort_of(self, queue: QueueName) -> str:
        """The name of the top of the queue's tree (the queue itself when it has no cohort)."""
        node = self._queues[queue]
        while node.parent is not None:
            node = node.parent
        return node.name

    def same_tree(self, a: QueueName, b: QueueName) -> bool:
        """Whether two queues can lend to each other (they share a root cohort)."""
        return self.root_cohort_of(a) == self.root_cohort_of(b)


class QuotaLedger:
    """Admitted usage per queue, rolled up the cohort tree. Mutable; ``copy()`` it for what-if work.

    Cohort usage is kept incrementally: admitting to a queue changes its contribution to its parent
    (``max(0, usage - guaranteed)``), and that delta walks up the tree, so each change is O(depth).
    """

    __slots__ = ("_tree", "_usage")

    def __init__(self, tree: QuotaTree) -> None:
        self._tree = tree
        self._usage: dict[int, dict[Resource, int]] = {}

    @property
    def tree(self) -> QuotaTree:
        return self._tree

    def copy(self) -> QuotaLedger:
        other = QuotaLedger(self._tree)
        other._usage = {k: dict(v) for k, v in self._usage.items()}
        return other

    def _get(self, node: _Node, r: Resource) -> int:
        u = self._usage.get(id(node))
        return 0 if u is None else u.get(r, 0)

    def _add(self, node: _Node, r: Resource, delta: int) -> None:
        while delta != 0:
            old = self._get(node, r)
            new = old + delta
            self._usage.setdefault(id(node), {})[r] = new
            parent = node.parent
            if parent is None:
                return
            g = node.guaranteed.get(r, 0)
            delta = max(0, new - g) - max(0, old - g)
            node = parent

    def usage(self, queue: QueueName, resource: Resource) -> int:
        return self._get(self._tree._queues[queue], resource)

    def usage_vector(self, queue: QueueName) -> dict[Resource, int]:
        return {r: v for r, v in self._usage.get(id(self._tree._queues[queue]), {}).items() if v}

    def cohort_usage(self, cohort: CohortName, resource: Resource) -> int:
        """What a cohort's members use of the cohort's shared pool (beyond their guaranteed parts)."""
        return self._get(self._tree._cohorts[cohort], resource)

    def admit(self, queue: QueueName, request: ResourceVector) -> None:
        """Record admitted work. Does not check: call :meth:`check` first (or you are replaying history)."""
        node = self._tree._queues[queue]
        for r, n in request.items():
            if n:
                self._add(node, r, n)

    def release(self, queue: QueueName, request: ResourceVector) -> None:
        node = self._tree._queues[queue]
        for r, n in request.items():
            if n:
                if self._get(node, r) < n:
                    raise ValueError(f"queue {queue} releases {n} {r} but uses only {self._get(node, r)}")
                self._add(node, r, -n)

    def _available(self, node: _Node, r: Resource) -> int:
        if node.unlimited:
            return UNLIMITED
        u = self._usage.get(id(node))  # `_get`, inlined: fair order asks this for every job
        usage = 0 if u is None else u.get(r, 0)
        subtree = node.subtree_quota.get(r, 0)
        if node.parent is None:
            return subtree - usage
        guaranteed = node.guaranteed.get(r, 0)
        local = max(0, guaranteed - usage)
        from_parent = self._available(node.parent, r)
        limit = node.borrowing_limit.get(r)
        if limit is not None:
            stored_in_parent = subtree - guaranteed
            used_in_parent = max(0, usage - guaranteed)
            from_parent = min(stored_in_parent - used_in_parent + limit, from_parent)
        return local + from_parent

    def available(self, queue: QueueName, resource: Resource) -> int:
        """How much more of ``resource`` the queue may be admitted now (its quota + what it may borrow)."""
        return self._available(self._tree._queues[queue], resource)

    def cohort_lendable(self, queue: QueueName, resource: Resource) -> int:
        """What the queue's cohort could still lend it beyond its own nominal quota."""
        node = self._tree._queues[queue]
        if node.parent is None:
            return 0
        own_left = max(0, node.subtree_quota.get(resource, 0) - self._get(node, resource))
        return max(0, self._available(node, resource) - own_left)

    def is_borrowing(self, queue: QueueName, resource: Resource | None = None) -> bool:
        """Whether the queue uses more than its nominal quota (of ``resource``, or of any resource)."""
        node = self._tree._queues[queue]
        if node.unlimited:
            return False
        resources = [resource] if resource is not None else list(self._usage.get(id(node), {}))
        return any(self._get(node, r) > node.subtree_quota.get(r, 0) for r in resources)

    def borrowed(self, queue: QueueName, resource: Resource) -> int:
        node = self._tree._queues[queue]
        if node.unlimited:
            return 0
        return max(0, self._get(node, resource) - node.subtree_quota.get(resource, 0))

    def fits(self, queue: QueueName, request: ResourceVector) -> bool:
        """``check(queue, request).fits`` without writing the reasons (orders and searches ask it often)."""
        node = self._tree._queues.get(queue)
        if node is None:
            return False
        return all(n <= self._available(node, r) for r, n in request.items() if n > 0)

    def check(self, queue: QueueName, request: ResourceVector) -> QuotaCheck:
        """May ``request`` be admitted to ``queue`` now? A "no" is a value with one sentence per resource."""
        if queue not in self._tree._queues:
            return QuotaCheck(False, False, (f"queue {queue} does not exist",))
        node = self._tree._queues[queue]
        reasons: list[str] = []
        borrows = False
        for r in sorted(request):
            n = request[r]
            if n <= 0:
                continue
            used = self._get(node, r)
            nominal = node.subtree_quota.get(r, 0)
            if used + n > nominal and not node.unlimited:
                borrows = True
            avail = self._available(node, r)
            if n > avail:
                reasons.append(self.explain_shortfall(queue, r, n))
        return QuotaCheck(not reasons, borrows, tuple(reasons))

    def explain_shortfall(self, queue: QueueName, resource: Resource, wanted: int) -> str:
        """E.g. "team-a uses 48 of its 48 H100; cohort has 0 to lend; needs 8"."""
        node = self._tree._queues[queue]
        used = self._get(node, resource)
        nominal = node.subtree_quota.get(resource, 0)
        text = f"{queue} uses {used} of its {nominal} {resource}"
        if node.parent is None:
            return f"{text}; no cohort to borrow from; needs {wanted}"
        limit = node.borrowing_limit.get(resource)
        if limit is not None and used + wanted - nominal > limit:
            borrowed = max(0, used - nominal)
            return f"{text}; borrows {borrowed} of its borrowing limit of {limit}; needs {wanted}"
        return f"{text}; cohort has {self.cohort_lendable(queue, resource)} to lend; needs {wanted}"

    def within_nominal(self, queue: QueueName, request: ResourceVector) -> bool:
        """Whether admitting ``request`` keeps the queue at or below its nominal quota of every resource."""
        node = self._tree._queues[queue]
        if node.unlimited:
            return True
        return all(self._get(node, r) + n <= node.subtree_quota.get(r, 0) for r, n in request.items() if n)
