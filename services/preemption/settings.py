"""Preemption settings (environment: GANGLINE_*)."""

from __future__ import annotations

from services.common.env import ServiceSettings


class PreemptionSettings(ServiceSettings):
    """``gated`` must match placement's (whether jobs wait for the quota service's job.queued)."""

    gated: bool = True
    profile_path: str | None = None
