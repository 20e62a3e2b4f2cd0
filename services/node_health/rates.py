"""Per-GPU rolling error rates (pure): job-fault XIDs and correctable ECC errors the agents report.

A GPU whose errors repeat above a limit within the window is drained (``degraded``) before it fails:
placement should put no new work on it, the running job may finish. Times are the events' own, so
folding the log again on restart rebuilds the same windows and the same verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from gangline.events.nodes import GpuErrorReported, GpuHealthChanged
from gangline.events.types import GpuId, NodeId
from gangline.nvml.health import Action, RollingCounter, classify_xid

ErrorKind = Literal["job_fault", "correctable_ecc"]
GpuKey = tuple[NodeId, GpuId]
HIGH_SBE_RATE_XID = 92


def error_kind(report: GpuHealthChanged | GpuErrorReported) -> ErrorKind | None:
    """What an agent's report says, as far as the rates care (None: not counted)."""
    cause = report.cause
    if cause.kind == "xid" and cause.xid is not None:
        if cause.xid == HIGH_SBE_RATE_XID:
            return "correctable_ecc"
        return "job_fault" if classify_xid(cause.xid).action is Action.FAIL_JOB else None
    if cause.kind == "ecc" and cause.message.startswith("ecc.sbe"):
        return "correctable_ecc"
    return None


@dataclass(frozen=True)
class RateVerdict:
    kind: ErrorKind
    count: int
    limit: int
    last_xid: int | None

    def sentence(self, node: NodeId, gpu: GpuId, window: timedelta) -> str:
        what = "job-fault XIDs" if self.kind == "job_fault" else "correctable ECC errors"
        return (
            f"{self.count} {what} on {node}/{gpu} within {window.total_seconds():g} s "
            f"(limit {self.limit}): drained before it fails"
        )


@dataclass
class GpuErrorRates:
    """Rolling windows of reported errors per GPU; ``limit`` counts within ``window`` mark it degraded.

    A node's re-registration (reset, agent restart, RMA swap) starts its GPUs' windows afresh.
    """

    window: timedelta
    job_fault_limit: int
    correctable_ecc_limit: int
    _counters: dict[ErrorKind, RollingCounter] = field(init=False)
    _epoch: dict[NodeId, int] = field(default_factory=dict, init=False)
    _last_xid: dict[GpuKey, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._counters = {
            "job_fault": RollingCounter(self.window),
            "correctable_ecc": RollingCounter(self.window),
        }

    def record(self, report: GpuHealthChanged | GpuErrorReported, at: datetime) -> ErrorKind | None:
        kind = error_kind(report)
        if kind is None:
            return None
        self._counters[kind].add(self._key(report.node, report.gpu), at)
        if report.cause.xid is not None:
            self._last_xid[(report.node, report.gpu)] = report.cause.xid
        return kind

    def reset_node(self, node: NodeId) -> None:
        self._epoch[node] = self._epoch.get(node, 0) + 1
        for key in [k for k in self._last_xid if k[0] == node]:
            del self._last_xid[key]

    def count(self, kind: ErrorKind, node: NodeId, gpu: GpuId, now: datetime) -> int:
        return int(self._counters[kind].count(self._key(node, gpu), now))

    def over_limit(self, node: NodeId, gpu: GpuId, now: datetime) -> RateVerdict | None:
        """The first kind of error above its limit on the GPU at ``now`` (job faults first)."""
        limits: tuple[tuple[ErrorKind, int], ...] = (
            ("job_fault", self.job_fault_limit),
            ("correctable_ecc", self.correctable_ecc_limit),
        )
        for kind, limit in limits:
            n = self.count(kind, node, gpu, now)
            if n >= limit:
                return RateVerdict(kind, n, limit, self._last_xid.get((node, gpu)))
        return None

    def _key(self, node: NodeId, gpu: GpuId) -> tuple[NodeId, GpuId, int]:
        return (node, gpu, self._epoch.get(node, 0))
