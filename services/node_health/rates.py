"""node_health's side of the drain policy: the agents' error reports folded into the core's windows.

The rule and its numbers are the core's (:mod:`gangline.core.health`: :class:`DrainPolicy`,
:class:`GpuErrorWindows`); this module only reads a report as a :class:`GpuError` and keys the windows
by node and GPU; a node's registration drops what its GPUs reported before it. Times are the events'
own, so folding the log again on restart rebuilds the same windows and the same verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gangline.core.health import (
    DrainPolicy,
    ErrorKind,
    GpuError,
    GpuErrorWindows,
    RateVerdict,
    xid_error_kind,
)
from gangline.events.nodes import GpuErrorReported, GpuHealthChanged
from gangline.events.types import GpuId, NodeId

GpuKey = tuple[NodeId, GpuId]


def error_of(report: GpuHealthChanged | GpuErrorReported, at: datetime) -> GpuError | None:
    """What an agent's report adds to the GPU's error counts (None: not a repeated error)."""
    cause = report.cause
    count = report.count if isinstance(report, GpuErrorReported) else 1
    if cause.kind == "xid" and cause.xid is not None:
        kind = xid_error_kind(cause.xid)
        return GpuError(kind, at, count=count, xid=cause.xid) if kind is not None else None
    if cause.kind == "ecc" and cause.message.startswith("ecc.sbe"):
        return GpuError("correctable_ecc", at, count=count)
    return None


def error_kind(report: GpuHealthChanged | GpuErrorReported) -> ErrorKind | None:
    """Which count a report adds to (None: not counted)."""
    error = error_of(report, datetime.min)
    return error.kind if error is not None else None


@dataclass
class GpuErrorRates:
    """The core's error windows over every agent's reports, per GPU.

    A node's re-registration (reset, agent restart, RMA swap) forgets its GPUs' errors from before it,
    and only those: an error reported after it may be folded first (the running service reads
    nodes.health and nodes.inventory in whichever order their records come; a restore reads inventory
    first), and both orders must leave the same windows.
    """

    policy: DrainPolicy = field(default_factory=DrainPolicy)
    _windows: GpuErrorWindows = field(init=False)

    def __post_init__(self) -> None:
        self._windows = GpuErrorWindows(self.policy)

    @property
    def window(self) -> timedelta:
        return self.policy.window

    def record(self, report: GpuHealthChanged | GpuErrorReported, at: datetime) -> ErrorKind | None:
        error = error_of(report, at)
        if error is None:
            return None
        self._windows.record(self._key(report.node, report.gpu), error)
        return error.kind

    def adopt_policy(self) -> None:
        """The windows (loaded from a snapshot) judge by this ``policy`` object, as built ones do."""
        self._windows.policy = self.policy

    def reset_node(self, node: NodeId, at: datetime) -> None:
        """The node registered at ``at``: its GPUs' errors from before then are forgotten."""
        for key in self._windows.recorded():
            if isinstance(key, tuple) and key[0] == node:
                self._windows.forget(key, before=at)

    def count(self, kind: ErrorKind, node: NodeId, gpu: GpuId, now: datetime) -> int:
        return self._windows.count(kind, self._key(node, gpu), now)

    def over_limit(self, node: NodeId, gpu: GpuId, now: datetime) -> RateVerdict | None:
        """The core's verdict on the GPU at ``now``: the first kind of error at its limit, or None."""
        return self._windows.verdict(self._key(node, gpu), now)

    def _key(self, node: NodeId, gpu: GpuId) -> GpuKey:
        return (node, gpu)
