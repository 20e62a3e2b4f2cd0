"""Quota settings (environment: GANGLINE_*)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from services.common.env import ServiceSettings


def _limits(value: object) -> object:
    """``"default=*,team-a=16"`` → {"default": None, "team-a": 16} (``*``: no limit)."""
    if not isinstance(value, str):
        return value
    limits: dict[str, int | None] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        queue, _, limit = item.partition("=")
        limits[queue.strip()] = None if limit.strip() in ("", "*") else int(limit)
    return limits


class QuotaSettings(ServiceSettings):
    """``queue_limits`` (GANGLINE_QUEUE_LIMITS): whole GPUs each queue may hold at once; ``*`` is no limit."""

    queue_limits: Annotated[dict[str, int | None], BeforeValidator(_limits)] = {"default": None}
