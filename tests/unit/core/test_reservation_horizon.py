"""The reservation horizon (`backfill.beyond_horizon`): a gang's reservation waits only while its earliest
start is known to be further off than the horizon, and never once the gang starves."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from gangline.core.actions.backfill import beyond_horizon

NOW = 10_000.0


def decide(start: float, *, horizon_s: float | None = 3600.0, waited_s: float = 0.0) -> bool:
    session: Any = SimpleNamespace(profile=SimpleNamespace(settings=SimpleNamespace(starvation_s=86_400.0)))
    ctx: Any = SimpleNamespace(now=NOW, submit_time={"gang": NOW - waited_s})
    job: Any = SimpleNamespace(id="gang")
    return beyond_horizon(session, ctx, job, start, horizon_s)


def test_a_start_within_the_horizon_holds_its_gpus_and_one_further_off_waits() -> None:
    assert not decide(NOW + 3600.0)
    assert decide(NOW + 3601.0)
    assert not decide(NOW + 10 * 86_400.0, horizon_s=None)


def test_an_unknown_start_holds_its_gpus_as_without_a_horizon() -> None:
    # Blocked by jobs with no known end: the start is inf, not known to be far, so the gang reserves
    # (a stream of small jobs with no hints would otherwise keep it off its GPUs until it starves).
    assert not decide(math.inf)


def test_a_starving_gang_holds_its_gpus_whatever_its_start() -> None:
    assert decide(NOW + 2 * 86_400.0, waited_s=86_399.0)
    assert not decide(NOW + 2 * 86_400.0, waited_s=86_400.0)
