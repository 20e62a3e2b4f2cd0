"""Admission settings (environment: GANGLINE_*)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from services.common.env import ServiceSettings


def _comma_list(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class AdmissionSettings(ServiceSettings):
    """``queues`` (GANGLINE_QUEUES, comma-separated): the queues requests may name; ``default`` is open."""

    queues: Annotated[tuple[str, ...], BeforeValidator(_comma_list), Field(min_length=1)] = ("default",)
