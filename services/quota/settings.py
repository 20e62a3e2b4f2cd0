"""Quota settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pydantic import Field

from gangline.telemetry.metrics import METRICS_PORTS
from services.common.env import ServiceSettings
from services.common.snapshots import SnapshotSettings
from services.quota.status import STATUS_INTERVAL_S


class QuotaSettings(ServiceSettings, SnapshotSettings):
    """The queues and their quotas come from ``queues_file`` (GANGLINE_QUEUES_FILE, shared with admission
    and the API). ``fair_share_half_life_s`` (GANGLINE_FAIR_SHARE_HALF_LIFE_S): how fast past usage is
    forgotten when waiting jobs are ordered by fair share; 0 is plain DRF on what is charged now.
    ``status_interval_s`` (GANGLINE_STATUS_INTERVAL_S): the least event time between two publications of
    one quota tree's ``queue.status`` (services/quota/status.py)."""

    metrics_port: int | None = Field(default=METRICS_PORTS["quota"], ge=0, le=65535)

    fair_share_half_life_s: float = Field(default=3600.0, ge=0)
    profile_path: str | None = None
    """The scheduling profile (GANGLINE_PROFILE_PATH, placement's): quota applies its gate settings
    (``settings.starvation_s``); the built-in default profile when unset."""
    status_interval_s: float = Field(default=STATUS_INTERVAL_S, ge=0)
