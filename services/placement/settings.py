"""Placement settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pydantic import Field

from gangline.core.waiting import FRONT_OF_LINE
from gangline.telemetry.metrics import METRICS_PORTS
from services.common.env import ServiceSettings
from services.common.snapshots import SnapshotSettings


class PlacementSettings(ServiceSettings, SnapshotSettings):
    """``gated``: place only jobs the quota service queued (job.queued); otherwise every admitted job."""

    metrics_port: int | None = Field(default=METRICS_PORTS["placement"], ge=0, le=65535)

    gated: bool = True
    profile_path: str | None = None
    """A scheduling profile YAML; the built-in default profile when unset."""
    max_jobs_per_cycle: int = Field(default=FRONT_OF_LINE, ge=1)
    """The most waiting jobs one cycle considers (highest priority first, then oldest)."""
