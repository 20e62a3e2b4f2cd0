"""DRF dominant share, usage decay with a half-life, and the service order."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangline.core.fairshare import (
    FairOrder,
    FairShare,
    Pending,
    UsageHistory,
    UsageIntegral,
    advance,
    decay_factor,
    dominant_share,
    ordered,
)
from gangline.core.queues import QueueName, Resource, ResourceVector, gpu_resource

H100 = gpu_resource("H100")
A100 = gpu_resource("A100")
A, B, C = QueueName("a"), QueueName("b"), QueueName("c")
HOUR = 3600.0


def test_decay_halves_per_half_life() -> None:
    assert decay_factor(HOUR, HOUR) == pytest.approx(0.5)
    assert decay_factor(2 * HOUR, HOUR) == pytest.approx(0.25)
    assert decay_factor(10.0, 0) == 0.0


def test_history_converges_to_a_constant_allocation_and_fades_after_it_stops() -> None:
    h = UsageHistory(as_of=0.0)
    h = advance(h, {A: {H100: 10}}, now=100 * HOUR, half_life_s=HOUR)
    assert h.of(A)[H100] == pytest.approx(10.0)
    h = advance(h, {}, now=101 * HOUR, half_life_s=HOUR)
    assert h.of(A)[H100] == pytest.approx(5.0)


def test_advancing_in_steps_equals_one_step() -> None:
    one = advance(UsageHistory(as_of=0.0), {A: {H100: 8}}, now=3 * HOUR, half_life_s=HOUR)
    many = UsageHistory(as_of=0.0)
    for t in range(1, 31):
        many = advance(many, {A: {H100: 8}}, now=t * HOUR / 10, half_life_s=HOUR)
    assert many.of(A)[H100] == pytest.approx(one.of(A)[H100])


EPOCH = 1.7e9
"""Event times are seconds since 1970: far from 0 in half-lives, as in the services."""

charges = st.lists(
    st.tuples(st.sampled_from([A, B]), st.integers(1, 8), st.floats(0, 300 * HOUR), st.floats(0, 50 * HOUR)),
    min_size=1,
    max_size=20,
)
"""Charges held: (queue, GPUs, from, for how long)."""


@settings(max_examples=200, deadline=None)
@given(held=charges, order=st.randoms(use_true_random=False), base=st.sampled_from([0.0, EPOCH]))
def test_the_integral_is_the_stepwise_history_and_does_not_depend_on_the_order_changes_are_learnt(
    held: list[tuple[QueueName, int, float, float]], order: object, base: float
) -> None:
    steps = [(q, H100, n, base + t) for q, n, t, _ in held] + [
        (q, H100, -n, base + t + d) for q, n, t, d in held
    ]
    at = max(s[3] for s in steps) + HOUR
    in_time = UsageIntegral(HOUR)
    in_time.add(steps)
    shuffled = list(steps)
    order.shuffle(shuffled)  # type: ignore[attr-defined]
    late = UsageIntegral(HOUR)
    for step in shuffled:
        late.add([step])
    # Exactly the same sums, so exactly the same history at any time: a restore reading the changes in
    # another order (topic by topic) computes the running service's figures to the last bit.
    assert late == in_time
    assert late.history(at) == in_time.history(at)
    # And the figure is the history advanced at every change (the integral of the charge over time).
    history, alloc = UsageHistory(as_of=0.0), {A: 0, B: 0}
    for q, _, n, t in sorted(steps, key=lambda s: s[3]):
        history = advance(history, {k: {H100: v} for k, v in alloc.items() if v}, now=t, half_life_s=HOUR)
        alloc[q] += n
    history = advance(history, {k: {H100: v} for k, v in alloc.items() if v}, now=at, half_life_s=HOUR)
    for q in (A, B):
        assert in_time.history(at).of(q).get(H100, 0.0) == pytest.approx(
            history.of(q).get(H100, 0.0), rel=1e-9, abs=1e-6
        )


def test_changes_taken_back_cancel_exactly() -> None:
    u = UsageIntegral(HOUR)
    kept = [(A, H100, 8, EPOCH), (A, H100, -8, EPOCH + HOUR)]
    u.add(kept)
    before = u.history(EPOCH + 2 * HOUR)
    guess = [(B, H100, 4, EPOCH + 0.5 * HOUR)]
    u.add(guess)
    assert u.history(EPOCH + 2 * HOUR) != before
    u.add(guess, -1)  # a job's charges worked out again: the old guess did not happen
    assert u.history(EPOCH + 2 * HOUR) == before
    assert u.history(EPOCH + 2 * HOUR).of(A)[H100] == pytest.approx(8 * (0.5 - 0.25))
    assert UsageIntegral(0.0).history(EPOCH).decayed == {}  # plain DRF: no history


def test_a_long_idle_queue_has_no_history_left() -> None:
    u = UsageIntegral(HOUR)
    u.add([(A, H100, 8, EPOCH), (A, H100, -8, EPOCH + HOUR)])
    assert u.history(EPOCH + 1000 * HOUR).decayed == {}


def test_history_refuses_to_go_back_in_time() -> None:
    with pytest.raises(ValueError):
        advance(UsageHistory(as_of=10.0), {}, now=5.0, half_life_s=HOUR)


def test_dominant_share_takes_the_largest_fraction_over_gpu_types() -> None:
    share, dom = dominant_share({H100: 8, A100: 8}, {H100: 64, A100: 16})
    assert (share, dom) == (0.5, A100)
    assert dominant_share({H100: 8}, {H100: 64}, weight=2.0)[0] == pytest.approx(1 / 16)
    assert dominant_share({Resource("B200"): 8}, {H100: 64}) == (0.0, None)


def test_fair_share_mixes_present_and_decayed_past() -> None:
    cap = {H100: 100}
    hist = UsageHistory(as_of=0.0, decayed={A: {H100: 40.0}})
    fair = FairShare(capacity=cap, weights={A: 1.0, B: 1.0}, allocation={B: {H100: 20}}, history=hist)
    assert fair.share(A) == pytest.approx(0.2)
    assert fair.share(B) == pytest.approx(0.1)
    plain = FairShare(capacity=cap, weights={A: 1.0, B: 1.0}, allocation={B: {H100: 20}})
    assert plain.share(B) == pytest.approx(0.2) and plain.share(A) == 0.0


def test_charge_raises_the_share_and_describe_names_position() -> None:
    fair = FairShare(capacity={H100: 10}, weights={A: 1.0, B: 1.0}, allocation={})
    fair.charge(A, {H100: 5})
    assert fair.share(A) == pytest.approx(0.5)
    assert fair.position(A) == (2, 2)
    assert fair.describe(A) == "a fair share 0.500 (dominant H100), position 2 of 2 queues"
    fair.uncharge(A, {H100: 5})
    assert fair.share(A) == 0.0


def _p(queue: QueueName, name: str, prio: int = 0, t: float = 0.0) -> Pending[str]:
    return Pending(queue=queue, priority=prio, submit_time=t, tie=name, item=name)


def test_order_is_priority_then_share_then_submit_time() -> None:
    fair = FairShare(capacity={H100: 100}, weights={A: 1.0, B: 1.0}, allocation={A: {H100: 50}})
    items = [_p(A, "a-urgent", prio=10, t=5), _p(A, "a-1", t=1), _p(B, "b-1", t=2), _p(B, "b-2", t=3)]
    got = ordered(items, fair, lambda _: {H100: 10})
    # b is poorer than a until it has taken 50 more GPUs, so both b jobs go before a's normal job.
    assert got == ["a-urgent", "b-1", "b-2", "a-1"]


def test_order_round_robins_between_equal_queues_as_shares_grow() -> None:
    fair = FairShare(capacity={H100: 100}, weights={A: 1.0, B: 1.0}, allocation={})
    items = [_p(A, f"a{i}", t=i) for i in range(3)] + [_p(B, f"b{i}", t=10 + i) for i in range(3)]
    assert ordered(items, fair, lambda _: {H100: 10}) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_weight_gives_a_bigger_share_of_turns() -> None:
    fair = FairShare(capacity={H100: 100}, weights={A: 2.0, B: 1.0}, allocation={})
    items = [_p(A, f"a{i}", t=i) for i in range(4)] + [_p(B, f"b{i}", t=i) for i in range(2)]
    # At equal shares (a after two jobs = b after one) submit time decides: b1 (t=1) before a2 (t=2).
    assert ordered(items, fair, lambda _: {H100: 10}) == ["a0", "b0", "a1", "b1", "a2", "a3"]


def test_skipped_item_lets_the_next_of_its_queue_through() -> None:
    fair = FairShare(capacity={H100: 100}, weights={A: 1.0}, allocation={})
    order = FairOrder([_p(A, "big", t=0), _p(A, "small", t=1)], fair)
    first = order.next()
    assert first is not None and first.item == "big"
    order.skipped()
    second = order.next()
    assert second is not None and second.item == "small"
    with pytest.raises(RuntimeError):
        order.next()
    order.admitted({H100: 1})
    assert order.next() is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([A, B, C]), st.integers(0, 3), st.integers(0, 50), st.integers(1, 8)),
        min_size=1,
        max_size=30,
    )
)
def test_order_is_deterministic_and_respects_priority(raw: list[tuple[QueueName, int, int, int]]) -> None:
    items = [Pending(q, prio, float(t), f"j{i}", (f"j{i}", prio, n)) for i, (q, prio, t, n) in enumerate(raw)]

    def run(xs: list[Pending[tuple[str, int, int]]]) -> list[tuple[str, int, int]]:
        fair = FairShare(capacity={H100: 64}, weights={A: 1.0, B: 2.0, C: 1.0}, allocation={})

        def req(x: tuple[str, int, int]) -> ResourceVector:
            return {H100: x[2]}

        return ordered(xs, fair, req)

    got = run(items)
    assert got == run(list(reversed(items)))
    assert sorted(got) == sorted(p.item for p in items)
    prios = [x[1] for x in got]
    assert prios == sorted(prios, reverse=True)


@settings(max_examples=100, deadline=None)
@given(st.floats(1.0, 1e6), st.floats(0.0, 1e6), st.integers(0, 1000))
def test_decayed_usage_stays_between_zero_and_the_allocation(half_life: float, dt: float, gpus: int) -> None:
    h = advance(UsageHistory(as_of=0.0), {A: {H100: gpus}}, now=dt, half_life_s=half_life)
    v = h.of(A).get(H100, 0.0)
    assert 0.0 <= v <= gpus + 1e-9
    assert math.isclose(v, gpus * (1 - 0.5 ** (dt / half_life)), rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B, C, QueueName("d")]), st.integers(-4, 8), st.sampled_from([H100, A100])
        ),
        max_size=20,
    )
)
def test_positions_and_dominant_resources_follow_every_charge(
    charges: list[tuple[QueueName, int, Resource]],
) -> None:
    """Asked between charges (answers are kept until the next charge), positions and dominant resources
    are those of a FairShare built fresh on the same allocation."""
    fair = FairShare(capacity={H100: 16, A100: 8}, weights={A: 1.0, B: 2.0}, allocation={C: {A100: 2}})
    alloc: dict[QueueName, dict[Resource, float]] = {C: {A100: 2.0}}
    for queue, n, resource in charges:
        if n >= 0:
            fair.charge(queue, {resource: n})
        else:
            fair.uncharge(queue, {resource: -n})
        vec = alloc.setdefault(queue, {})
        vec[resource] = vec.get(resource, 0.0) + n
        fresh = FairShare(capacity={H100: 16, A100: 8}, weights={A: 1.0, B: 2.0}, allocation=alloc)
        for q in (A, B, C, QueueName("d"), QueueName("e")):
            assert fair.position(q) == fresh.position(q)
            assert fair.dominant_resource(q) == fresh.dominant_resource(q)
            assert fair.describe(q) == fresh.describe(q)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["charge", "uncharge", "describe"]), st.sampled_from([A, B, C]), st.integers(1, 8)
        ),
        max_size=30,
    )
)
def test_a_remembered_description_is_what_a_fresh_fair_share_with_the_same_charges_says(
    ops: list[tuple[str, QueueName, int]],
) -> None:
    # describe() keeps its sentence until the next charge: it must be the one a share charged the
    # same but never asked before gives.
    weights = {A: 1.0, B: 2.0, C: 1.0}
    fair = FairShare(capacity={H100: 64}, weights=weights, allocation={})
    charged: dict[QueueName, dict[Resource, float]] = {}
    for op, queue, n in ops:
        if op == "charge":
            fair.charge(queue, {H100: n})
            charged.setdefault(queue, {})[H100] = charged.get(queue, {}).get(H100, 0.0) + n
        elif op == "uncharge":
            fair.uncharge(queue, {H100: n})
            charged.setdefault(queue, {})[H100] = charged.get(queue, {}).get(H100, 0.0) - n
        for q in (A, B, C):
            fresh = FairShare(capacity={H100: 64}, weights=weights, allocation=charged)
            assert fair.describe(q) == fresh.describe(q)
