"""How the processor counts failed attempts: which errors blame the input, when a batch's records go
one by one, when a record becomes poison. (Against the broker: tests/integration/bus/test_poison_kafka.py.)"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.errors import (
    KafkaConnectionError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    RecordTooLargeError,
)

from gangline.bus import Processor, ProcessorSettings
from gangline.bus.processor import _blames_the_input, _HandlerFailed

TP = TopicPartition("in", 0)


@dataclass(frozen=True)
class Record:
    offset: int
    topic: str = "in"
    partition: int = 0


def processor(**overrides: object) -> Processor:
    settings = ProcessorSettings.model_validate(
        {
            "bootstrap_servers": "127.0.0.1:1",
            "service": "s",
            "instance_id": "i",
            "group_id": "g",
            "input_topics": ("in",),
            **overrides,
        }
    )
    return Processor(settings, lambda envelope, meta: [])


def test_the_default_is_three_attempts() -> None:
    assert processor()._settings.max_batch_attempts == 3


def test_network_and_retriable_broker_errors_never_count_against_the_input() -> None:
    for transient in (
        ConnectionError("reset"),
        TimeoutError(),
        KafkaConnectionError("down"),
        NotLeaderForPartitionError(),
    ):
        assert not _blames_the_input(transient), transient
    for blaming in (
        MessageSizeTooLargeError("1.2 MB"),
        RecordTooLargeError(),
        RecursionError(),
        ValueError("bad"),
    ):
        assert _blames_the_input(blaming), blaming


def test_a_batch_failing_three_times_is_split_and_a_record_failing_alone_three_times_is_poison() -> None:
    p = processor()
    batch = {TP: [Record(5), Record(6), Record(7)]}
    for _ in range(2):
        p._count_failure(batch, ValueError("bad"))
    assert p._isolate_until == {}
    p._count_failure(batch, ValueError("bad"))
    assert p._isolate_until == {TP: 8}
    alone = {TP: [Record(6)]}
    for attempt in range(3):
        assert ("in", 0, 6) not in p._poison, attempt
        p._count_failure(alone, MessageSizeTooLargeError("big"))
    assert isinstance(p._poison[("in", 0, 6)], MessageSizeTooLargeError)
    # A poison record whose dead letter fails too goes without its dead-letter outputs next time.
    p._count_failure(alone, ValueError("rejection cannot be built"))
    assert ("in", 0, 6) in p._bare_poison


def test_handler_failures_and_outages_leave_the_counts_alone() -> None:
    p = processor(max_batch_attempts=1)
    batch = {TP: [Record(1), Record(2)]}
    p._count_failure(batch, _HandlerFailed("the handler's own count"))
    p._count_failure(batch, KafkaConnectionError("down"))
    p._count_failure({TP: [Record(1)]}, ConnectionError("reset"))
    assert p._isolate_until == {} and p._failures == {} and p._poison == {}
