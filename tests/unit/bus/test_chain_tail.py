"""Reading the chain's tail at start: a forged record there is skipped, never a crash."""

from __future__ import annotations

from aiokafka import TopicPartition

from gangline.bus.chain import _note
from gangline.events.chain import HASH_HEADER, SEQ_HEADER

TP = TopicPartition("allocations.log", 0)
CHAIN = [(SEQ_HEADER, b"7"), (HASH_HEADER, b"ab")]


def test_a_chained_record_is_noted_under_its_source() -> None:
    last: dict[tuple[str, int, str], dict[str, str]] = {}
    _note(last, TP, CHAIN, b'{"source":"gangline/placement"}')
    assert last == {("allocations.log", 0, "gangline/placement"): {SEQ_HEADER: "7", HASH_HEADER: "ab"}}


def test_json_nested_10000_deep_is_skipped_not_a_recursion_error() -> None:
    last: dict[tuple[str, int, str], dict[str, str]] = {}
    for value in (b"[" * 10_000 + b"]" * 10_000, b"not json", b"[1]"):
        _note(last, TP, CHAIN, value)
    assert last == {}
