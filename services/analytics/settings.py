"""Analytics settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from services.common.env import ServiceSettings


class AnalyticsSettings(ServiceSettings):
    """The faust app's id is ``<group_prefix>.analytics``: its consumer group, the prefix of its own
    topics (``<id>-<table>-changelog``, ``<id>-measures``) and of its transactional ids."""

    analytics_host: str = "127.0.0.1"
    analytics_port: int = Field(default=8091, ge=1, le=65_535)
    """GANGLINE_ANALYTICS_PORT: the JSON figures (``/analytics/...``) and Prometheus' ``/metrics``."""
    analytics_data_dir: Path | None = None
    """GANGLINE_ANALYTICS_DATA_DIR: faust's data directory (the memory store keeps nothing there; unset: a
    fresh temporary directory). The tables live in their changelog topics."""
    replication_factor: int = Field(default=1, ge=1)
    """Of the app's own topics (changelogs, measures); 3 on a real cluster."""
    hourly_retention_days: int = Field(default=35, ge=1)
    daily_retention_days: int = Field(default=400, ge=1)
    commit_interval_s: float = Field(default=1.0, gt=0)
    """How often faust commits its transaction (outputs, changelogs and offsets together)."""

    @property
    def app_id(self) -> str:
        return f"{self.group_prefix}.analytics"
