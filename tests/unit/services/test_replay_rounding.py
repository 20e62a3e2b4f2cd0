"""Replay's comparison: decisions exactly, rounded reports within one unit of their last digit."""

from __future__ import annotations

from services.common.replay import first_difference


def status(share: float, position: int = 1) -> dict[str, object]:
    return {
        "type": "gangline.queue.status.v1",
        "data": {"queue": "team", "dominant_share": share, "position": position},
    }


def test_a_rounded_share_one_unit_apart_is_the_same_report() -> None:
    assert first_difference(status(0.420441), status(0.42044), "") is None
    assert first_difference(status(0.006055), status(0.006054), "") is None


def test_a_share_two_units_apart_or_another_field_is_a_difference() -> None:
    assert first_difference(status(0.420442), status(0.42044), "") == (
        "data.dominant_share",
        0.420442,
        0.42044,
    )
    assert first_difference(status(0.5, 1), status(0.5, 2), "") == ("data.position", 1, 2)


def test_the_tolerance_is_for_the_reported_share_only() -> None:
    granted = {"data": {"lost_gpu_hours": 0.420441}}
    assert first_difference(granted, {"data": {"lost_gpu_hours": 0.42044}}, "") is not None
    assert first_difference(status(True), status(False), "") is not None  # type: ignore[arg-type]
