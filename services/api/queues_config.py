"""The queue configuration file: queues, their cohorts, weights and nominal quotas per resource.

::

    cohorts:
      - name: lab
    queues:
      - name: research
        cohort: lab
        weight: 2
        quotas:
          H100: {nominal: 16, borrowing_limit: 8}
          A100/1g.10gb: {nominal: 14}

The ``default`` queue exists even when the file does not list it (no quota of its own).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gangline.core.queues import (
    CohortName,
    CohortSpec,
    QueueName,
    QueueSpec,
    QuotaTree,
    Resource,
    ResourceQuota,
)
from services.api.auth import DEFAULT_QUEUE


class _Quota(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nominal: int = Field(ge=0)
    borrowing_limit: int | None = Field(default=None, ge=0)
    lending_limit: int | None = Field(default=None, ge=0)


class _Queue(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    cohort: str | None = None
    weight: float = Field(default=1.0, gt=0)
    quotas: dict[str, _Quota] = Field(default_factory=dict)


class _Cohort(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    parent: str | None = None
    quotas: dict[str, _Quota] = Field(default_factory=dict)


class QueuesFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cohorts: tuple[_Cohort, ...] = ()
    queues: tuple[_Queue, ...] = ()


def _quotas(quotas: dict[str, _Quota]) -> dict[Resource, ResourceQuota]:
    return {
        Resource(r): ResourceQuota(q.nominal, q.borrowing_limit, q.lending_limit) for r, q in quotas.items()
    }


def quota_tree(doc: QueuesFile) -> QuotaTree:
    """The queues and cohorts of ``doc`` as the core's quota tree (which refuses cycles, unknown cohorts)."""
    queues = [
        QueueSpec(
            QueueName(q.name),
            _quotas(q.quotas),
            CohortName(q.cohort) if q.cohort else None,
            q.weight,
        )
        for q in doc.queues
    ]
    if DEFAULT_QUEUE not in {q.name for q in queues}:
        queues.append(QueueSpec(QueueName(DEFAULT_QUEUE)))
    cohorts = [
        CohortSpec(CohortName(c.name), CohortName(c.parent) if c.parent else None, _quotas(c.quotas))
        for c in doc.cohorts
    ]
    return QuotaTree(queues, cohorts)


def load_queues(path: Path | None) -> QuotaTree:
    """The quota tree of the file at ``path``; only the ``default`` queue when there is none."""
    if path is None:
        return quota_tree(QueuesFile())
    return quota_tree(QueuesFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")) or {}))
