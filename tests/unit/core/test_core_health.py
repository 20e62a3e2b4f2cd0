"""The drain policy: single XIDs by their class, repeated errors by their count within the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gangline.core.health import (
    XID_RULES,
    Action,
    DrainPolicy,
    ErrorKind,
    GpuError,
    GpuErrorWindows,
    classify_xid,
    event_health,
    health_of,
    rate_verdict,
    xid_error_kind,
)

T0 = datetime(2025, 3, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def errors(kind: ErrorKind, *seconds: float, xid: int | None = None) -> list[GpuError]:
    return [GpuError(kind, at(s), xid=xid) for s in seconds]


# ---- single events --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xid", "health", "kind"),
    [
        (79, "failed", None),  # fallen off the bus: cordoned at once
        (48, "failed", None),  # double-bit ECC
        (95, "failed", None),
        (74, "failed", None),
        (63, "degraded", None),  # row remap pending: drained at once
        (94, "degraded", None),
        (154, "degraded", None),
        (13, "healthy", "job_fault"),  # the job's fault: counted, the GPU stays
        (31, "healthy", "job_fault"),
        (43, "healthy", "job_fault"),
        (32, "healthy", "warning_xid"),
        (999, "healthy", "warning_xid"),  # unknown codes are watched, never acted on blindly
        (92, "healthy", "correctable_ecc"),  # the driver's high-SBE-rate XID counts with SBEs
        (45, "healthy", None),  # cleanup noise after a kill
    ],
)
def test_xid_classes(xid: int, health: str, kind: ErrorKind | None) -> None:
    assert event_health(xid) == health
    assert xid_error_kind(xid) == kind


def test_actions_map_to_gpu_states() -> None:
    assert [health_of(a) for a in (*Action, None)] == [
        "failed",
        "degraded",
        "healthy",
        "healthy",
        "healthy",
        "healthy",
    ]
    assert classify_xid(79).fails_job and not classify_xid(63).fails_job


# ---- repeated errors ------------------------------------------------------------------------------


def test_the_defaults_are_the_documented_ones() -> None:
    p = DrainPolicy()
    assert (p.window, p.job_fault_xids, p.warning_xids, p.correctable_ecc) == (HOUR, 3, 3, 100)


@pytest.mark.parametrize(
    ("kind", "limit", "policy"),
    [
        ("job_fault", 4, DrainPolicy(job_fault_xids=4)),
        ("warning_xid", 2, DrainPolicy(warning_xids=2)),
        ("correctable_ecc", 5, DrainPolicy(correctable_ecc=5)),
    ],
)
def test_each_limit_drains_at_its_count_and_not_before(
    kind: ErrorKind, limit: int, policy: DrainPolicy
) -> None:
    seen = errors(kind, *range(limit))
    assert rate_verdict(seen[:-1], at(limit), policy) is None
    verdict = rate_verdict(seen, at(limit), policy)
    assert verdict is not None
    assert (verdict.kind, verdict.count, verdict.limit, verdict.health) == (kind, limit, limit, "degraded")


def test_counts_weigh_and_kinds_are_counted_apart() -> None:
    p = DrainPolicy(job_fault_xids=3, warning_xids=3, correctable_ecc=100)
    mixed = [
        *errors("job_fault", 1, 2, xid=13),
        *errors("warning_xid", 3, 4, xid=32),
        GpuError("correctable_ecc", at(5), count=99),
    ]
    assert rate_verdict(mixed, at(10), p) is None
    verdict = rate_verdict([*mixed, GpuError("correctable_ecc", at(6))], at(10), p)
    assert verdict is not None and (verdict.kind, verdict.count) == ("correctable_ecc", 100)


def test_job_faults_are_looked_at_first_and_name_the_last_xid() -> None:
    p = DrainPolicy(job_fault_xids=2, correctable_ecc=1)
    seen = [
        *errors("job_fault", 1, xid=13),
        *errors("job_fault", 2, xid=31),
        GpuError("correctable_ecc", at(3)),
    ]
    verdict = rate_verdict(seen, at(4), p)
    assert verdict is not None and (verdict.kind, verdict.last_xid) == ("job_fault", 31)
    assert verdict.sentence("n0/gpu1") == (
        "2 job-fault XIDs on n0/gpu1 within 3600 s (limit 2): drained before it fails"
    )


def test_window_edges() -> None:
    p = DrainPolicy(window=HOUR, job_fault_xids=2)
    # The window is (now - window, now]: an error exactly an hour old has left it.
    assert rate_verdict(errors("job_fault", 0, 3600), at(3600), p) is None
    assert rate_verdict(errors("job_fault", 0.001, 3600), at(3600), p) is not None
    # Errors after ``now`` do not count yet; out of order is fine.
    assert rate_verdict(errors("job_fault", 10, 20), at(15), p) is None
    assert rate_verdict(errors("job_fault", 20, 10), at(20), p) is not None


def test_a_policy_needs_a_window_and_limits() -> None:
    with pytest.raises(ValueError, match="window"):
        DrainPolicy(window=timedelta(0))
    with pytest.raises(ValueError, match="limit"):
        DrainPolicy(correctable_ecc=0)


def test_windows_forget_a_reset_gpu() -> None:
    w = GpuErrorWindows(DrainPolicy(job_fault_xids=2))
    for e in errors("job_fault", 1, 2, xid=13):
        w.record("g", e)
    assert w.verdict("g", at(3)) is not None and w.verdict("other", at(3)) is None
    w.forget("g")
    assert w.verdict("g", at(3)) is None and w.count("job_fault", "g", at(3)) == 0


def test_windows_forget_only_what_came_before_a_reset() -> None:
    # The errors after the reset stay, in whichever order the reset and they were folded.
    w = GpuErrorWindows(DrainPolicy(job_fault_xids=2))
    for e in errors("job_fault", 1, 4, 5, xid=13):
        w.record("g", e)
    w.forget("g", before=at(4))
    assert w.count("job_fault", "g", at(6)) == 2 and w.verdict("g", at(6)) is not None
    w.forget("g", before=at(6))
    assert w.recorded() == [] and w.verdict("g", at(6)) is None


_KINDS: tuple[ErrorKind, ...] = ("job_fault", "warning_xid", "correctable_ecc")


@given(
    st.lists(
        st.tuples(
            st.sampled_from(_KINDS), st.integers(0, 7200), st.integers(1, 40), st.sampled_from([None, 13, 32])
        ),
        max_size=30,
    ),
    st.integers(0, 9000),
)
def test_the_incremental_windows_decide_what_the_rule_decides(
    raw: list[tuple[ErrorKind, int, int, int | None]], now_s: int
) -> None:
    policy = DrainPolicy(window=HOUR, job_fault_xids=3, warning_xids=4, correctable_ecc=50)
    seen = sorted((GpuError(k, at(s), count=n, xid=x) for k, s, n, x in raw), key=lambda e: e.at)
    windows = GpuErrorWindows(policy)
    for e in seen:
        windows.record("g", e)
    assert windows.verdict("g", at(now_s)) == rate_verdict(seen, at(now_s), policy)


def test_a_counted_xid_never_changes_its_gpu_by_itself() -> None:
    """What the agent reports for the rates is never also a change of state (nor the reverse)."""
    for xid in [*XID_RULES, 0, 999]:
        counted = xid_error_kind(xid) is not None
        assert not counted or event_health(xid) == "healthy", xid
        assert counted or classify_xid(xid).action in (Action.CORDON, Action.DRAIN, Action.IGNORE), xid
