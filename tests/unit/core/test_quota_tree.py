"""Queues, cohorts, borrowing and lending limits: the quota ledger."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangline.core.queues import (
    CohortName,
    CohortSpec,
    QueueName,
    QueueSpec,
    QuotaConfigError,
    QuotaLedger,
    QuotaTree,
    Resource,
    ResourceQuota,
    gpu_resource,
    mig_resource,
)

H100 = gpu_resource("H100")
A100 = gpu_resource("A100")
MIG = mig_resource("A100", "1g.10gb")
A, B, C = QueueName("team-a"), QueueName("team-b"), QueueName("team-c")
LAB = CohortName("lab")


def tree(
    a: ResourceQuota, b: ResourceQuota, *, c: ResourceQuota | None = None, cohort: str | None = "lab"
) -> QuotaTree:
    co = CohortName(cohort) if cohort else None
    queues = [QueueSpec(A, {H100: a}, cohort=co), QueueSpec(B, {H100: b}, cohort=co)]
    if c is not None:
        queues.append(QueueSpec(C, {H100: c}, cohort=co))
    return QuotaTree(queues)


def test_within_nominal_fits_without_borrowing() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(48), ResourceQuota(16)))
    check = ledger.check(A, {H100: 48})
    assert check.fits and not check.borrows


def test_borrows_idle_quota_of_cohort() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(48), ResourceQuota(16)))
    ledger.admit(A, {H100: 48})
    check = ledger.check(A, {H100: 16})
    assert check.fits and check.borrows
    assert ledger.available(A, H100) == 16
    assert not ledger.check(A, {H100: 17}).fits


def test_explanation_names_usage_nominal_and_what_cohort_lends() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(48), ResourceQuota(16)))
    ledger.admit(A, {H100: 48})
    ledger.admit(B, {H100: 16})
    check = ledger.check(A, {H100: 8})
    assert not check.fits
    assert check.reason == "team-a uses 48 of its 48 H100; cohort has 0 to lend; needs 8"


def test_borrowing_limit_caps_what_a_queue_may_take() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(8, borrowing_limit=4), ResourceQuota(32)))
    ledger.admit(A, {H100: 12})
    assert ledger.available(A, H100) == 0
    check = ledger.check(A, {H100: 1})
    assert not check.fits
    assert "borrowing limit" in check.reason


def test_lending_limit_keeps_part_of_the_quota_for_its_owner() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(16, lending_limit=4), ResourceQuota(0)))
    # team-b has no quota of its own: it may borrow only what team-a lends.
    assert ledger.available(B, H100) == 4
    ledger.admit(B, {H100: 4})
    assert ledger.available(B, H100) == 0
    assert ledger.available(A, H100) == 12
    assert ledger.check(A, {H100: 12}).fits


def test_queue_without_cohort_cannot_borrow() -> None:
    t = QuotaTree([QueueSpec(A, {H100: ResourceQuota(8)}), QueueSpec(B, {H100: ResourceQuota(8)})])
    ledger = QuotaLedger(t)
    ledger.admit(A, {H100: 8})
    check = ledger.check(A, {H100: 1})
    assert not check.fits
    assert "no cohort to borrow from" in check.reason
    assert not t.same_tree(A, B)


def test_mig_profiles_are_separate_resources() -> None:
    t = QuotaTree([QueueSpec(A, {A100: ResourceQuota(4), MIG: ResourceQuota(7)})])
    ledger = QuotaLedger(t)
    ledger.admit(A, {MIG: 7})
    assert ledger.check(A, {A100: 4}).fits
    assert not ledger.check(A, {MIG: 1}).fits


def test_unknown_resource_has_no_quota() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(8), ResourceQuota(8)))
    assert not ledger.check(A, {A100: 1}).fits


def test_nested_cohorts_lend_across_levels_and_cohort_quota_is_shared() -> None:
    cohorts = [
        CohortSpec(CohortName("org")),
        CohortSpec(CohortName("research"), parent=CohortName("org"), quotas={H100: ResourceQuota(8)}),
        CohortSpec(CohortName("prod"), parent=CohortName("org")),
    ]
    queues = [
        QueueSpec(A, {H100: ResourceQuota(16)}, cohort=CohortName("research")),
        QueueSpec(B, {H100: ResourceQuota(16)}, cohort=CohortName("research")),
        QueueSpec(C, {H100: ResourceQuota(32)}, cohort=CohortName("prod")),
    ]
    ledger = QuotaLedger(QuotaTree(queues, cohorts))
    # 16 + 16 + 8 shared in research, + 32 lent by prod through org.
    assert ledger.available(A, H100) == 72
    ledger.admit(C, {H100: 32})
    assert ledger.available(A, H100) == 40
    ledger.admit(A, {H100: 40})
    assert ledger.available(B, H100) == 0
    assert ledger.cohort_usage(CohortName("research"), H100) == 40


def test_release_returns_quota_and_refuses_more_than_used() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(8), ResourceQuota(8)))
    ledger.admit(A, {H100: 12})
    ledger.release(A, {H100: 12})
    assert ledger.available(A, H100) == 16
    with pytest.raises(ValueError):
        ledger.release(A, {H100: 1})


def test_copy_is_independent() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(8), ResourceQuota(8)))
    other = ledger.copy()
    other.admit(A, {H100: 8})
    assert ledger.usage(A, H100) == 0 and other.usage(A, H100) == 8


def test_is_borrowing_and_borrowed() -> None:
    ledger = QuotaLedger(tree(ResourceQuota(8), ResourceQuota(8)))
    ledger.admit(A, {H100: 10})
    assert ledger.is_borrowing(A) and ledger.borrowed(A, H100) == 2
    assert not ledger.is_borrowing(B)


@pytest.mark.parametrize(
    ("queues", "cohorts", "message"),
    [
        ([QueueSpec(A), QueueSpec(A)], [], "defined twice"),
        ([QueueSpec(A)], [CohortSpec(LAB, parent=CohortName("nope"))], "not defined"),
        (
            [QueueSpec(A)],
            [CohortSpec(LAB, parent=CohortName("x")), CohortSpec(CohortName("x"), parent=LAB)],
            "cycle",
        ),
    ],
)
def test_bad_configuration_is_refused(
    queues: list[QueueSpec], cohorts: list[CohortSpec], message: str
) -> None:
    with pytest.raises(QuotaConfigError, match=message):
        QuotaTree(queues, cohorts)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError):
        ResourceQuota(-1)
    with pytest.raises(ValueError):
        QueueSpec(A, weight=0)


# ---- properties ----

quota = st.builds(
    ResourceQuota,
    nominal=st.integers(0, 64),
    borrowing_limit=st.none() | st.integers(0, 64),
    lending_limit=st.none() | st.integers(0, 64),
)
NAMES = [QueueName(f"q{i}") for i in range(5)]


@st.composite
def trees(draw: st.DrawFn) -> QuotaTree:
    n = draw(st.integers(2, 5))
    nested = draw(st.booleans())
    cohorts = [CohortSpec(CohortName("root"))]
    if nested:
        cohorts += [
            CohortSpec(CohortName("left"), parent=CohortName("root"), quotas={H100: draw(quota)}),
            CohortSpec(CohortName("right"), parent=CohortName("root")),
        ]
    homes = ["left", "right"] if nested else ["root"]
    queues = [
        QueueSpec(
            NAMES[i],
            {H100: draw(quota), A100: draw(quota)},
            cohort=CohortName(draw(st.sampled_from(homes))),
        )
        for i in range(n)
    ]
    return QuotaTree(queues, cohorts)


ops = st.lists(
    st.tuples(st.booleans(), st.integers(0, 4), st.sampled_from([H100, A100]), st.integers(1, 24)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(trees(), ops)
def test_admitted_work_never_exceeds_quota_borrowing_or_lending_limits(
    t: QuotaTree, steps: list[tuple[bool, int, Resource, int]]
) -> None:
    ledger = QuotaLedger(t)
    names = t.queue_names()
    for is_admit, qi, r, n in steps:
        q = names[qi % len(names)]
        if is_admit:
            if ledger.check(q, {r: n}).fits:
                ledger.admit(q, {r: n})
        elif ledger.usage(q, r) >= n:
            ledger.release(q, {r: n})
        for name in names:
            for res in (H100, A100):
                used = ledger.usage(name, res)
                nominal = t.nominal(name, res)
                limit = t.borrowing_limit(name, res)
                if limit is not None:
                    assert used <= nominal + limit
                # Whatever the others took, a queue can still get what it never lends.
                guaranteed = t.guaranteed(name, res)
                assert ledger.available(name, res) >= guaranteed - used
        for res in (H100, A100):
            # All admitted work fits in all quota there is, shared cohort quota included.
            assert sum(ledger.usage(x, res) for x in names) <= t.total_nominal(res)
