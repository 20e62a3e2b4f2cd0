"""The public topics under an optional prefix, so tests and parallel clusters can share one broker."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

import gangline.events.topics as catalogue
from gangline.bus.admin import TopicSpec


class TopicNames(BaseModel):
    """The eight public topic names and quota's ticks, each ``prefix + <catalogue name>`` (prefix "" in
    production)."""

    model_config = ConfigDict(frozen=True)

    prefix: str = ""

    def _name(self, base: str) -> str:
        return f"{self.prefix}{base}"

    @property
    def requests(self) -> str:
        return self._name(catalogue.JOBS_REQUESTS)

    @property
    def events(self) -> str:
        return self._name(catalogue.JOBS_EVENTS)

    @property
    def allocations(self) -> str:
        return self._name(catalogue.ALLOCATIONS_LOG)

    @property
    def inventory(self) -> str:
        return self._name(catalogue.NODES_INVENTORY)

    @property
    def heartbeats(self) -> str:
        return self._name(catalogue.NODES_HEARTBEATS)

    @property
    def health(self) -> str:
        return self._name(catalogue.NODES_HEALTH)

    @property
    def operator(self) -> str:
        return self._name(catalogue.NODES_OPERATOR)

    @property
    def queue_status(self) -> str:
        return self._name(catalogue.QUEUES_STATUS)

    @property
    def quota_ticks(self) -> str:
        return self._name(catalogue.QUOTA_TICKS)

    def snapshots(self, service: str) -> str:
        """The compacted topic ``service`` writes snapshots of its state to (``<service>.snapshots``)."""
        return self._name(catalogue.snapshot_topic(service))

    def pooled(self) -> tuple[str, ...]:
        """The topics split by pool (a pool's records on its partition: gangline.bus.pools)."""
        return tuple(self._name(spec.name) for spec in catalogue.CATALOGUE if spec.pooled)

    def specs(self) -> list[TopicSpec]:
        """Every catalogue topic (and dead-letter twin) under this prefix, ready for ``ensure_topics``."""
        return [
            TopicSpec(
                name=self._name(spec.name),
                key=spec.key,
                partitions=spec.partitions,
                cleanup_policy=spec.cleanup_policy,
                retention_ms=spec.retention_ms,
                segment_ms=spec.segment_ms,
                dead_letter=self._name(spec.dead_letter) if spec.dead_letter else None,
            )
            for spec in catalogue.CATALOGUE
        ]
