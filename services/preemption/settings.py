"""Preemption settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pydantic import Field

from gangline.telemetry.metrics import METRICS_PORTS
from services.common.env import LAZY_LINGER_MS, ServiceSettings
from services.common.snapshots import SnapshotSettings


class PreemptionSettings(ServiceSettings, SnapshotSettings):
    """``gated`` must match placement's (whether jobs wait for the quota service's job.queued)."""

    metrics_port: int | None = Field(default=METRICS_PORTS["preemption"], ge=0, le=65535)

    linger_ms: int = Field(default=LAZY_LINGER_MS, ge=0)
    """Preemption mostly folds the cluster's events and acts on a few (plans, checkpoints) whose
    deadlines are seconds long: it waits longer to fill a batch (see LAZY_LINGER_MS)."""
    gated: bool = True
    profile_path: str | None = None
    min_runtime_s: float = Field(default=0.0, ge=0)
    """A job that has run less than this is never a victim (it has not had time to checkpoint)."""
