"""Where a pool's records go on the bus: its partition of each pooled topic.

A cluster split into pools (:mod:`gangline.core.pools`) puts every record about a pool's nodes and its
routed jobs on the partition of the pool's index in each pooled topic (``pooled`` in the catalogue:
``jobs.events``, ``allocations.log``, ``nodes.*``), so one owner per pool reads its pool's partitions
only, and writes there. The record's key stays the job or node id: one pool's records of one key are in
one partition, in order.

Who writes where:

* a pool's placement (and its other pool-owned services) sends every output on a pooled topic to its
  pool's partition (:func:`to_pool`);
* a node agent sends its node's records, and the reports of the jobs it runs, to its node's pool's
  partition (:func:`to_pool` with the agent's pool);
* quota routes each admitted job to a pool (``job.routed``) and sends what it writes about the job to
  that pool's partition; what admission writes goes by the key (no pool owner reads it: a pool folds a
  job from its ``job.routed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeAlias

from gangline.events.base import Envelope

PartitionOf: TypeAlias = Callable[[str, Envelope], int | None]
"""Which partition of ``topic`` an output goes to; None: the key's (Kafka's default partitioner)."""


def by_key(topic: str, envelope: Envelope) -> int | None:
    """Every record by its key: no pools."""
    return None


def to_pool(partition: int, pooled_topics: Iterable[str]) -> PartitionOf:
    """Records on the pooled topics to ``partition`` (one pool's), the others by their key."""
    pooled = frozenset(pooled_topics)

    def partition_of(topic: str, envelope: Envelope) -> int | None:
        return partition if topic in pooled else None

    return partition_of
