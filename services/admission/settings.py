"""Admission settings (environment: GANGLINE_*)."""

from __future__ import annotations

from pydantic import Field

from gangline.telemetry.metrics import METRICS_PORTS
from services.common.env import ServiceSettings


class AdmissionSettings(ServiceSettings):
    """The queues requests may name and their quotas come from ``queues_file`` (GANGLINE_QUEUES_FILE,
    see :mod:`services.common.queues`); without one, only the unlimited ``default`` queue exists."""

    metrics_port: int | None = Field(default=METRICS_PORTS["admission"], ge=0, le=65535)
