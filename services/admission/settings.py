"""Admission settings (environment: GANGLINE_*)."""

from __future__ import annotations

from services.common.env import ServiceSettings


class AdmissionSettings(ServiceSettings):
    """The queues requests may name and their quotas come from ``queues_file`` (GANGLINE_QUEUES_FILE,
    see :mod:`services.common.queues`); without one, only the unlimited ``default`` queue exists."""
