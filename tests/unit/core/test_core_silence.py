"""The silence rule: a node's silence counts over the time the bus was heard, so an outage (a pause in every
node's heartbeats longer than the gap) counts toward nobody's silence, whatever its length."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gangline.core.silence import Hearing, silent

T0 = datetime(2026, 3, 1, tzinfo=UTC)
SILENCE = timedelta(seconds=10)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def cluster(beats: dict[str, list[float]], *, gap: float = 2.0) -> tuple[Hearing, dict[str, datetime]]:
    """Every node's beats (seconds), heard in time order; each node's last beat."""
    hearing = Hearing(s(gap))
    for t in sorted(t for times in beats.values() for t in times):
        hearing.hear(at(t))
    return hearing, {node: at(max(times)) for node, times in beats.items()}


def every(step: float, start: float, end: float) -> list[float]:
    n = round((end - start) / step)
    return [start + k * step for k in range(n + 1)]


def test_one_node_silent_while_the_others_beat_is_silent_after_the_silence() -> None:
    beats = {"a": every(0.5, 0, 3), "b": every(0.5, 0, 13), "c": every(0.5, 0, 13)}
    hearing, seen = cluster(beats)
    assert silent(seen, hearing, silence=SILENCE) == []  # a's last beat at 3, judged at 13: exactly 10 s
    hearing.hear(at(13.5))
    assert silent(seen, hearing, silence=SILENCE) == [("a", s(10.5))]


def test_an_outage_shorter_than_the_silence_counts_toward_no_node() -> None:
    # Every node beats twice a second; the broker is down from t=5 to t=14 (9 s against a 10 s silence).
    before = every(0.5, 0, 5)
    beats = {"a": [*before, 14.0], "b": before, "c": before}  # a is heard first after it; b and c come late
    hearing, seen = cluster(beats)
    assert hearing.heard_within(at(5), at(14)) == s(2)  # the gap's first 2 s; the 7 s past it were an outage
    assert silent(seen, hearing, silence=SILENCE) == []
    # b and c stay unheard while a beats: silent once the bus was heard for 10 s since their last beat.
    for t in every(0.5, 14.5, 22):
        hearing.hear(at(t))
    assert silent(seen, hearing, silence=SILENCE) == []  # 2 s before the outage + 8 s after it
    hearing.hear(at(22.5))
    assert silent(seen, hearing, silence=SILENCE) == [("b", s(10.5)), ("c", s(10.5))]


def test_without_the_outage_rule_the_same_late_nodes_would_be_silent() -> None:
    """The case that failed nodes after a short outage: in wall time b and c are silent at t=16."""
    before = every(0.5, 0, 5)
    hearing, seen = cluster({"a": [*before, 14.0, 16.0], "b": before})
    assert at(16) - seen["b"] > SILENCE
    assert silent(seen, hearing, silence=SILENCE) == []


def test_an_outage_longer_than_the_silence_counts_toward_no_node_either() -> None:
    before = every(0.5, 0, 5)
    hearing, seen = cluster({"a": [*before, 65.0], "b": before})  # a minute without any beat
    assert silent(seen, hearing, silence=SILENCE) == []
    assert hearing.heard_within(seen["b"], at(65)) == s(2)
    for t in every(0.5, 65.5, 73.5):
        hearing.hear(at(t))
    assert [node for node, _ in silent(seen, hearing, silence=SILENCE)] == ["b"]


def test_pauses_of_the_stream_up_to_the_gap_are_heard_in_full() -> None:
    hearing, seen = cluster({"a": every(2.0, 0, 12), "b": [0.0]}, gap=2.0)
    assert hearing.intervals == [(at(0), at(14))]
    assert silent(seen, hearing, silence=SILENCE) == [("b", s(12))]


def test_a_node_never_heard_after_the_start_counts_from_when_it_is_watched() -> None:
    hearing, _ = cluster({"a": every(1.0, 0, 20)})
    assert silent({"b": at(5)}, hearing, silence=SILENCE) == [("b", s(15))]
    assert silent({"b": at(5)}, Hearing(s(2)), silence=SILENCE) == []  # nothing heard yet: nobody silent


@given(
    st.lists(st.floats(min_value=0, max_value=120, allow_nan=False), min_size=1, max_size=60), st.randoms()
)
def test_what_was_heard_does_not_depend_on_the_order_the_beats_were_read_in(
    times: list[float], rng: random.Random
) -> None:
    in_order = Hearing(s(2))
    for t in sorted(times):
        in_order.hear(at(t))
    shuffled = Hearing(s(2))
    for t in rng.sample(times, len(times)):
        shuffled.hear(at(t))
    assert shuffled.intervals == in_order.intervals and shuffled.latest == in_order.latest
    # The union is disjoint and sorted, and each beat is inside it.
    spans = in_order.intervals
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))
    assert all(any(lo <= at(t) <= hi for lo, hi in spans) for t in times)


@given(
    st.lists(st.floats(min_value=0, max_value=120, allow_nan=False), min_size=1, max_size=60),
    st.floats(min_value=0, max_value=120, allow_nan=False),
    st.floats(min_value=0, max_value=60, allow_nan=False),
)
def test_forgetting_what_ended_before_an_instant_changes_no_answer_from_it(
    times: list[float], cut: float, span: float
) -> None:
    whole, pruned = Hearing(s(2)), Hearing(s(2))
    for t in times:
        whole.hear(at(t))
        pruned.hear(at(t))
    pruned.forget_before(at(cut))
    since = at(cut + span / 2)
    assert pruned.heard_within(since, at(cut + span)) == whole.heard_within(since, at(cut + span))


def test_the_gap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="gap"):
        Hearing(s(0))
