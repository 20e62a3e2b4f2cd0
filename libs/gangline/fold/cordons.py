"""The operators' cordons as a fold of nodes.operator (pure): the latest word per node, by event time.

Shared by the lifecycle fold (:class:`gangline.fold.cluster.ClusterFold`, whose snapshot marks these
nodes cordoned for placement) and by node_health (which asks a drained node's work to leave), so both
read one cordon state. Folding the same events again, or a stale one after a newer, changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gangline.core.cordon import Cordon
from gangline.events.base import Envelope
from gangline.events.nodes import NodeCordoned, NodeUncordoned
from gangline.events.types import NodeId

CORDON_EVENTS = ("node.cordoned", "node.uncordoned")


@dataclass
class NodeCordons:
    """Per node, the time of the latest operator event and the cordon it left (None: uncordoned)."""

    latest: dict[NodeId, tuple[datetime, Cordon | None]] = field(default_factory=dict)
    evicts_at: dict[NodeId, float] = field(default_factory=dict)
    """The standing drains: when each one's running work must leave (what :meth:`evicting` reads)."""

    def fold(self, envelope: Envelope) -> bool:
        """Apply a node.cordoned / node.uncordoned; True when it changed a node's cordon."""
        data = envelope.data
        if not isinstance(data, NodeCordoned | NodeUncordoned):
            return False
        previous = self.latest.get(data.node)
        if previous is not None and envelope.time < previous[0]:
            return False  # older than the word that stands: read again, not news
        cordon = (
            Cordon(
                mode=data.mode,
                since=envelope.time.timestamp(),
                drain_grace_s=float(data.drain_grace_s) if data.drain_grace_s is not None else None,
                reason=data.reason,
            )
            if isinstance(data, NodeCordoned)
            else None
        )
        self.latest[data.node] = (envelope.time, cordon)
        at = cordon.evicts_at if cordon is not None else None
        if at is None:
            self.evicts_at.pop(data.node, None)
        else:
            self.evicts_at[data.node] = at
        return previous is None or previous[1] != cordon

    def of(self, node: NodeId) -> Cordon | None:
        entry = self.latest.get(node)
        return entry[1] if entry is not None else None

    def cordoned(self, node: NodeId) -> bool:
        """Whether an operator keeps new work off ``node`` (a cordon or a drain stands)."""
        return self.of(node) is not None

    def evicting(self, now: datetime) -> list[NodeId]:
        """The drained nodes whose running work must be asked to leave at ``now``, in id order."""
        at = now.timestamp()
        return sorted(n for n, due in self.evicts_at.items() if at >= due)
