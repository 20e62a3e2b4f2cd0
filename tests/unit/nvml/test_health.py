"""Pure health classification: the XID table, the rolling windows, edge triggering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gangline.nvml.health import (
    Action,
    GpuHealthMonitor,
    RollingCounter,
    classify_xid,
    worst,
)
from gangline.nvml.types import (
    EccCounts,
    GpuEvent,
    GpuEventKind,
    GpuHealthSample,
    GpuState,
    GpuUuid,
    RetiredPages,
)

T0 = datetime(2025, 3, 1, tzinfo=UTC)
G = GpuUuid("GPU-a")


@pytest.mark.parametrize(
    ("xid", "action", "fails_job"),
    [
        (48, Action.CORDON, True),
        (79, Action.CORDON, True),
        (64, Action.CORDON, True),
        (63, Action.DRAIN, False),
        (74, Action.CORDON, True),
        (92, Action.WATCH, False),
        (94, Action.DRAIN, True),
        (95, Action.CORDON, True),
        (13, Action.FAIL_JOB, True),
        (31, Action.FAIL_JOB, True),
        (43, Action.FAIL_JOB, True),
        (45, Action.IGNORE, False),
        (999, Action.WATCH, False),
    ],
)
def test_xid_classification(xid: int, action: Action, fails_job: bool) -> None:
    rule = classify_xid(xid)
    assert (rule.action, rule.fails_job) == (action, fails_job)


def test_rolling_counter_forgets_what_left_the_window() -> None:
    c = RollingCounter(timedelta(hours=1))
    c.add(G, T0, 5)
    c.add(G, T0 + timedelta(minutes=30), 2)
    c.add(G, T0 + timedelta(minutes=10), 1)  # out of order is fine

    assert c.count(G, T0 + timedelta(minutes=30)) == 8
    assert c.count(G, T0 + timedelta(minutes=65)) == 3
    assert c.count(G, T0 + timedelta(minutes=95)) == 0
    assert c.rate_per_hour("other", T0) == 0.0


def test_rolling_counter_ignores_future_and_rejects_empty_window() -> None:
    c = RollingCounter(timedelta(minutes=5))
    c.add(G, T0 + timedelta(minutes=2))
    assert c.count(G, T0) == 0 and c.count(G, T0 + timedelta(minutes=2)) == 1
    with pytest.raises(ValueError, match="positive"):
        RollingCounter(timedelta(0))


def sample(**kw: object) -> GpuHealthSample:
    return GpuHealthSample.model_validate({"uuid": G, "index": 0, "state": GpuState.OK, **kw})


def ecc(corrected: int) -> EccCounts:
    return EccCounts(
        corrected_volatile=corrected,
        uncorrected_volatile=0,
        corrected_aggregate=corrected,
        uncorrected_aggregate=0,
    )


def correctable(m: GpuHealthMonitor) -> list[int]:
    return [e.count for _, e in m.take_errors() if e.kind == "correctable_ecc"]


def test_counter_reset_is_not_a_negative_rate() -> None:
    m = GpuHealthMonitor()
    m.observe_sample(sample(ecc=ecc(50)), T0)  # the first sample is a baseline, not a burst
    assert correctable(m) == [] and m.active() == []
    m.observe_sample(sample(ecc=ecc(2)), T0 + timedelta(minutes=1))  # driver reload reset the counter
    assert correctable(m) == [2]
    m.observe_sample(sample(ecc=ecc(12)), T0 + timedelta(minutes=2))
    assert correctable(m) == [10]
    assert m.active() == [] and m.degraded() == []  # counted for node_health's rate, not judged here


def test_correctable_errors_announced_by_events_are_not_counted_twice_by_the_counter() -> None:
    m = GpuHealthMonitor()
    m.observe_sample(sample(ecc=ecc(0)), T0)
    sbe = GpuEvent(kind=GpuEventKind.SINGLE_BIT_ECC, uuid=G, event_type=2, xid=None)
    m.observe_event(sbe, T0 + timedelta(seconds=1))
    m.observe_event(sbe, T0 + timedelta(seconds=2))
    assert correctable(m) == [1, 1]
    m.observe_sample(sample(ecc=ecc(5)), T0 + timedelta(seconds=3))  # 2 announced, 3 not
    assert correctable(m) == [3]
    assert m.take_errors() == []


def test_countable_xids_are_handed_on_with_their_kind() -> None:
    m = GpuHealthMonitor()
    for xid in (13, 32, 92, 45, 79):
        m.observe_event(GpuEvent(kind=GpuEventKind.XID, uuid=G, event_type=8, xid=xid), T0)
    assert [(e.kind, e.xid) for _, e in m.take_errors()] == [
        ("job_fault", 13),
        ("warning_xid", 32),
        ("correctable_ecc", 92),
    ]
    assert m.verdict(G) is Action.CORDON  # the 79, at once


def test_retired_pages_near_the_limit_cordon() -> None:
    m = GpuHealthMonitor()
    found = m.observe_sample(
        sample(retired_pages=RetiredPages(single_bit_ecc=40, double_bit_ecc=21, pending=False)), T0
    )
    assert [(f.code, f.action) for f in found] == [("retired_pages.limit", Action.CORDON)]


def test_worst_orders_by_severity() -> None:
    m = GpuHealthMonitor()
    m.observe_sample(sample(temperature_c=99, state=GpuState.LOST), T0)
    assert worst(m.active()) is Action.CORDON and worst([]) is None


def test_health_imports_without_pynvml() -> None:
    """node_health and the simulator use this module; it must not drag NVML in."""
    import subprocess
    import sys

    code = "import sys, gangline.nvml.health; sys.exit('pynvml' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
