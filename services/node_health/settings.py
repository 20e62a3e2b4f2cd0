"""Node-health settings (environment: GANGLINE_*)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from gangline.core.health import DrainPolicy
from gangline.telemetry.metrics import METRICS_PORTS
from services.common.env import LAZY_LINGER_MS, ServiceSettings
from services.common.snapshots import SnapshotSettings

_DRAIN = DrainPolicy()


class NodeHealthSettings(ServiceSettings, SnapshotSettings):
    """``silence_s``: a node that has not heartbeaten for this long (of the time the bus was heard:
    ``outage_gap_s``) is declared failed.

    The drain policy's numbers (:class:`gangline.core.health.DrainPolicy`, whose defaults these are):
    a GPU with ``job_fault_xids_limit`` job-fault XIDs, ``warning_xids_limit`` warning XIDs or
    ``correctable_ecc_limit`` correctable ECC errors reported within ``error_window_s`` is drained
    (degraded). The agents apply no rate of their own: these are the only drain thresholds.
    """

    metrics_port: int | None = Field(default=METRICS_PORTS["node_health"], ge=0, le=65535)

    linger_ms: int = Field(default=LAZY_LINGER_MS, ge=0)
    """node_health mostly folds heartbeats and allocations; a silence is seconds long: it waits longer
    to fill a batch (see LAZY_LINGER_MS)."""
    silence_s: float = Field(default=10.0, gt=0)
    check_every_s: float = Field(default=0.5, gt=0)
    outage_gap_s: float | None = Field(default=None, gt=0)
    """GANGLINE_OUTAGE_GAP_S: no node's heartbeat in the log for longer than this is an outage of the bus,
    which counts toward no node's silence (:mod:`gangline.core.silence`). Longer than the agents'
    heartbeat interval; unset: half of ``silence_s``."""
    error_window_s: float = Field(default=_DRAIN.window.total_seconds(), gt=0)
    job_fault_xids_limit: int = Field(default=_DRAIN.job_fault_xids, ge=1)
    warning_xids_limit: int = Field(default=_DRAIN.warning_xids, ge=1)
    correctable_ecc_limit: int = Field(default=_DRAIN.correctable_ecc, ge=1)

    def drain_policy(self) -> DrainPolicy:
        return DrainPolicy(
            window=timedelta(seconds=self.error_window_s),
            job_fault_xids=self.job_fault_xids_limit,
            warning_xids=self.warning_xids_limit,
            correctable_ecc=self.correctable_ecc_limit,
        )
