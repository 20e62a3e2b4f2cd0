"""The queue configuration file, one for admission, quota and the API (``GANGLINE_QUEUES_FILE``);
placement and preemption read it too, for the unlimited queues whose jobs skip quota, and
`gangline replay --profile P --queues Q.yaml` (what-if) reads the same file the same way.

::

    cohorts:
      - name: lab
    queues:
      - name: default
        unlimited: true          # no quota: its jobs go to placement at once
      - name: research
        cohort: lab
        weight: 2
        quotas:
          H100-SXM5-80GB: {nominal: 16, borrowing_limit: 8}
          A100-SXM4-80GB/1g.10gb: {nominal: 14}

A resource is a GPU model (whole GPUs), ``<model>/<MIG profile>`` (slices) or ``<model>/milli``
(thousandths of a shared GPU), as the core's :mod:`gangline.core.queues` counts them. A queue that
is not ``unlimited`` may use only what its quotas and its cohort allow; a resource it has no quota
for anywhere in its tree is one it cannot use. An ``unlimited`` queue is outside the quota tree:
its work is counted but never held back, and it takes GPUs no cohort's quota accounts for, so an
operator who gives every team a quota over the whole cluster should not also keep one.

Without a file there is one queue, ``default``, unlimited: every producer's jobs run as capacity
allows. A file is authoritative: ``default`` exists only if it lists it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gangline.core.queues import (
    CohortName,
    CohortSpec,
    QueueName,
    QueueSpec,
    QuotaLedger,
    QuotaTree,
    Resource,
    ResourceQuota,
    gpu_resource,
    mig_resource,
)
from gangline.events.jobs import JobSpec

DEFAULT_QUEUE = "default"
SHARED_SUFFIX = "/milli"


class _Quota(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nominal: int = Field(ge=0)
    borrowing_limit: int | None = Field(default=None, ge=0)
    lending_limit: int | None = Field(default=None, ge=0)


class _Queue(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    cohort: str | None = None
    weight: float = Field(default=1.0, gt=0)
    unlimited: bool = False
    quotas: dict[str, _Quota] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unlimited_alone(self) -> _Queue:
        if self.unlimited and (self.quotas or self.cohort):
            raise ValueError(f"queue {self.name}: an unlimited queue has no quotas and no cohort")
        return self


class _Cohort(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    parent: str | None = None
    quotas: dict[str, _Quota] = Field(default_factory=dict)


class QueuesFile(BaseModel):
    """The file's document, validated (unknown keys are errors, so a typo never silently drops quota)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cohorts: tuple[_Cohort, ...] = ()
    queues: tuple[_Queue, ...] = (_Queue(name=DEFAULT_QUEUE, unlimited=True),)


def _quotas(quotas: Mapping[str, _Quota]) -> dict[Resource, ResourceQuota]:
    return {
        Resource(r): ResourceQuota(q.nominal, q.borrowing_limit, q.lending_limit) for r, q in quotas.items()
    }


@dataclass(frozen=True)
class Queues:
    """The queues requests may name: the quota tree of the limited ones, and the unlimited ones."""

    tree: QuotaTree
    unlimited: frozenset[QueueName]
    resource_order: tuple[Resource, ...]
    """Every resource with quota somewhere, in the order the file first names it: the order in which a
    job that names no GPU type is tried against its queue's quotas, after the models its own quotas
    name (like Kueue's flavour order)."""
    whole_tree: QuotaTree
    """``tree`` with the unlimited queues in it too (no quota, outside every cohort): what a core cycle
    over every running job needs, such as preemption's victim search."""

    def names(self) -> list[QueueName]:
        return sorted({*self.tree.queue_names(), *self.unlimited})

    def known(self, queue: str) -> bool:
        return queue in self.unlimited or self.tree.has_queue(queue)

    def limited(self, queue: str) -> bool:
        return self.tree.has_queue(queue)

    def weight(self, queue: QueueName) -> float:
        return self.tree.weight(queue) if self.tree.has_queue(queue) else 1.0

    def requests(self, spec: JobSpec) -> Iterator[tuple[str | None, dict[Resource, int]]]:
        """Each way ``spec`` may be charged: (GPU model, resource vector), in the order to try them.

        A job naming its GPU type has one; one naming none has one per model the quota tree counts
        (for its MIG profile or shared slots when it asks for those). An unlimited queue's job is
        charged to its GPU type, or ``None``: "any model", decided by placement.
        """
        if not self.limited(spec.queue):
            yield spec.gpu_type, request_on(spec, spec.gpu_type or "any")
            return
        models: list[str] = []
        if spec.gpu_type is not None:
            models.append(spec.gpu_type)
        else:
            own = tuple(self.tree.spec(QueueName(spec.queue)).quotas)
            for r in (*own, *self.resource_order):
                model = r.split("/", 1)[0]
                if model not in models:
                    models.append(model)
        for model in models:
            yield model, request_on(spec, model)

    def can_ever_fit(self, spec: JobSpec) -> str | None:
        """None when an empty cluster's quotas would let ``spec`` run; else why they never will."""
        if not self.limited(spec.queue):
            return None
        empty = QuotaLedger(self.tree)
        reasons: list[str] = []
        for model, request in self.requests(spec):
            check = empty.check(QueueName(spec.queue), request)
            if check.fits:
                return None
            reasons.append(f"{model}: {check.reason}")
        if not reasons:
            return f"queue {spec.queue} has no quota for any GPU type"
        why = "; ".join(reasons)
        return f"queue {spec.queue} can never hold this job, even with the whole cohort idle ({why})"


def unlimited_queues(path: Path | None) -> frozenset[str]:
    """The unlimited queues of the file at ``path`` (only ``default`` without one): placement and
    preemption's mirror take their jobs once admitted, since quota writes no ``job.queued`` for them."""
    return frozenset(load_queues(path).unlimited)


def request_on(spec: JobSpec, model: str) -> dict[Resource, int]:
    """What ``spec`` uses of ``model``: whole GPUs, MIG slices (one per worker) or milli-GPUs."""
    if spec.mig_profile is not None:
        return {mig_resource(model, spec.mig_profile): spec.workers}
    if spec.gpu_fraction_milli is not None:
        return {Resource(f"{model}{SHARED_SUFFIX}"): spec.workers * spec.gpu_fraction_milli}
    return {gpu_resource(model): spec.total_gpus}


def quota_specs(doc: QueuesFile) -> tuple[list[QueueSpec], list[CohortSpec]]:
    """The document's limited queues and its cohorts, as :class:`gangline.core.queues.QuotaTree` takes
    them (unlimited queues are outside the tree); raises ValueError on a queue defined twice."""
    names = [q.name for q in doc.queues]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"queue {twice[0]} is defined twice")
    specs = [
        QueueSpec(QueueName(q.name), _quotas(q.quotas), CohortName(q.cohort) if q.cohort else None, q.weight)
        for q in doc.queues
        if not q.unlimited
    ]
    cohorts = [
        CohortSpec(CohortName(c.name), CohortName(c.parent) if c.parent else None, _quotas(c.quotas))
        for c in doc.cohorts
    ]
    return specs, cohorts


def queues_of(doc: QueuesFile) -> Queues:
    """The document as :class:`Queues`; raises :class:`gangline.core.queues.QuotaConfigError` or
    ValueError on a bad shape (a queue defined twice, an unknown parent cohort, a cycle)."""
    specs, cohorts = quota_specs(doc)
    order: dict[Resource, None] = {}
    for c in doc.cohorts:
        order.update(dict.fromkeys(Resource(r) for r in c.quotas))
    for q in doc.queues:
        order.update(dict.fromkeys(Resource(r) for r in q.quotas))
    unlimited = frozenset(QueueName(q.name) for q in doc.queues if q.unlimited)
    return Queues(
        tree=QuotaTree(specs, cohorts),
        unlimited=unlimited,
        resource_order=tuple(order),
        whole_tree=QuotaTree([*specs, *(QueueSpec(q, unlimited=True) for q in sorted(unlimited))], cohorts),
    )


def load_queues_file(path: Path | None) -> QueuesFile:
    """The validated document of the file at ``path``; the default (an unlimited ``default``) for None."""
    if path is None:
        return QueuesFile()
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return QueuesFile.model_validate(raw)


def load_queues(path: Path | None) -> Queues:
    """The queues of the file at ``path``; only an unlimited ``default`` queue when there is none."""
    return queues_of(load_queues_file(path))
