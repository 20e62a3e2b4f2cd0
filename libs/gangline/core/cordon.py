"""Operators' cordons (pure): a cordoned node takes no new work; a drained one also sends its work away.

The rule "no new work" is the core's health filter on ``Node.cordoned`` (:mod:`gangline.core.plugins.health`):
the lifecycle fold marks a node cordoned while an operator's cordon or drain stands, as it does for a
failed node. What a drain adds is when its running work must leave: :meth:`Cordon.evicts` once
``drain_grace_s`` has passed since the drain; then each job still there is asked to checkpoint, as a
preemption asks, and requeued to run elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CordonMode = Literal["cordon", "drain"]


@dataclass(frozen=True, slots=True)
class Cordon:
    """One standing operator cordon of a node: since when (seconds), and for a drain, its grace."""

    mode: CordonMode
    since: float
    drain_grace_s: float | None = None
    reason: str | None = None

    @property
    def evicts_at(self) -> float | None:
        """When the running work of a drained node is asked to leave; None for a plain cordon."""
        if self.mode != "drain" or self.drain_grace_s is None:
            return None
        return self.since + self.drain_grace_s

    def evicts(self, now: float) -> bool:
        """Whether running work on the node must be asked to leave at ``now``."""
        at = self.evicts_at
        return at is not None and now >= at
