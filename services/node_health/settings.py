"""Node-health settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pydantic import Field

from services.common.env import LAZY_LINGER_MS, ServiceSettings


class NodeHealthSettings(ServiceSettings):
    """``silence_s``: a node that has not heartbeaten for this long is declared failed.

    ``error_window_s``, ``job_fault_xids_limit``, ``correctable_ecc_limit``: a GPU with this many
    job-fault XIDs (or correctable ECC errors) reported within the window is drained (degraded).
    """

    linger_ms: int = Field(default=LAZY_LINGER_MS, ge=0)
    """node_health mostly folds heartbeats and allocations; a silence is seconds long: it waits longer
    to fill a batch (see LAZY_LINGER_MS)."""
    silence_s: float = Field(default=10.0, gt=0)
    check_every_s: float = Field(default=0.5, gt=0)
    error_window_s: float = Field(default=3600.0, gt=0)
    job_fault_xids_limit: int = Field(default=3, ge=1)
    correctable_ecc_limit: int = Field(default=100, ge=1)
