"""Node-health settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pydantic import Field

from services.common.env import ServiceSettings


class NodeHealthSettings(ServiceSettings):
    """``silence_s``: a node that has not heartbeaten for this long is declared failed."""

    silence_s: float = Field(default=10.0, gt=0)
    check_every_s: float = Field(default=0.5, gt=0)
