"""The operators' commands' own logic (no API): output formats, ages, --since, and top's cluster map."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gangline.client.operator import Column, Frame, cluster_map, duration, parse_since, render

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_the_three_output_formats() -> None:
    items = [{"job_id": "j1", "queue": "q", "extra": 3}]
    columns = [Column("JOB", lambda j: j["job_id"]), Column("EXTRA", lambda j: j["extra"], wide=True)]
    assert render(items, columns, "table") == "JOB\nj1"
    assert render(items, columns, "wide") == "JOB  EXTRA\nj1   3"
    assert json.loads(render(items, columns, "json")) == {"items": items}  # what the API gave, whole


def test_durations_and_since() -> None:
    assert [duration(s) for s in (0, 59, 60, 3599, 3600, 86_399, 90_000)] == [
        "0s", "59s", "1m00s", "59m59s", "1h00m", "23h59m", "1d1h",
    ]  # fmt: skip
    assert duration(None) is None
    assert parse_since("90m", NOW) == NOW - timedelta(minutes=90)
    assert parse_since("2d", NOW) == NOW - timedelta(days=2)
    assert parse_since("2026-02-28T08:00:00Z", NOW) == datetime(2026, 2, 28, 8, tzinfo=UTC)
    assert parse_since("2026-02-28T08:00:00", NOW) == datetime(2026, 2, 28, 8, tzinfo=UTC)  # UTC by default
    with pytest.raises(ValueError, match="give a time"):
        parse_since("yesterday", NOW)


def node(name: str, leaf: str, cordon: dict[str, object] | None = None, **health: str) -> dict[str, object]:
    return {
        "node": name,
        "state": "ready",
        "spine": "s0",
        "leaf": leaf,
        "gpus": [{"id": f"gpu{i}"} for i in range(4)],
        "gpu_health": health,
        "cordon": cordon,
        "health_reason": None,
    }


def test_the_cluster_map_shows_queues_free_failed_and_out_of_service_gpus() -> None:
    drain = {"mode": "drain", "reason": "psu"}
    frame = Frame(
        nodes=[
            node("a", "l0", gpu3="failed"),
            node("b", "l0", drain),
            node("c", "l1", drain),
            node("d", "l1", {"mode": "cordon", "reason": None}, gpu0="degraded"),
        ],
        queues=[],
        held=[
            {"allocation_id": "x.1", "job_id": "x", "queue": "vision", "node": "a", "gpus": ["gpu0", "gpu1"]},
            {"allocation_id": "y.1", "job_id": "y", "queue": "nlp", "node": "b", "gpus": ["gpu2"]},
        ],
    )
    lines = cluster_map(frame, wide=True).splitlines()
    assert lines[0] == "spine s0 / leaf l0"
    assert lines[1].split() == ["a", "[BB.X]", "ready"]  # queues lettered in name order: nlp A, vision B
    assert lines[2].split() == ["b", "[##A#]", "ready,", "draining:", "psu"]  # work still on it
    assert lines[3] == "spine s0 / leaf l1"
    assert lines[4].split() == ["c", "[####]", "ready,", "drained:", "psu"]  # empty now
    assert lines[5].split() == ["d", "[d###]", "ready,", "cordoned"]
    assert lines[-1].endswith("A=nlp  B=vision")
