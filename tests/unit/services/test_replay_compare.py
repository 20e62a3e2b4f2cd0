"""Replay's comparison: every field exactly, reported figures included (quota's shares are a function of
the log's facts to the last bit: gangline.core.fairshare.UsageIntegral)."""

from __future__ import annotations

from services.common.replay import first_difference


def status(share: float, position: int = 1) -> dict[str, object]:
    return {
        "type": "gangline.queue.status.v1",
        "data": {"queue": "team", "dominant_share": share, "position": position},
    }


def test_a_rounded_share_one_unit_apart_is_a_difference() -> None:
    assert first_difference(status(0.420441), status(0.420441), "") is None
    assert first_difference(status(0.420441), status(0.42044), "") == (
        "data.dominant_share",
        0.420441,
        0.42044,
    )


def test_another_field_is_a_difference() -> None:
    assert first_difference(status(0.5, 1), status(0.5, 2), "") == ("data.position", 1, 2)
    granted = {"data": {"lost_gpu_hours": 0.420441}}
    assert first_difference(granted, {"data": {"lost_gpu_hours": 0.42044}}, "") is not None
