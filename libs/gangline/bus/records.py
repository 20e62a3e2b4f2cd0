"""What the bus hands a handler besides the event, and how a record is dead-lettered (pure).

A record that cannot be decoded, or that keeps failing its handler, is copied to the input
topic's dead-letter twin byte for byte, with its original key and headers, plus the
``gangline-dlq-*`` headers below saying why and where it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gangline.events.topics import dead_letter_topic

DLQ_REASON = "gangline-dlq-reason"
DLQ_CODE = "gangline-dlq-code"
DLQ_TOPIC = "gangline-dlq-topic"
DLQ_PARTITION = "gangline-dlq-partition"
DLQ_OFFSET = "gangline-dlq-offset"
DLQ_SOURCE_SERVICE = "gangline-dlq-source-service"

HANDLER_FAILED = "handler_failed"
"""The DLQ code of a record whose handler kept raising (decode failures use the DecodeError codes)."""


class KafkaRecord(Protocol):
    """The fields of ``aiokafka.ConsumerRecord`` the bus reads (a protocol so tests need no broker)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class RecordMeta:
    """Where a consumed event sat in Kafka: handed to handlers next to the decoded envelope."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...]

    @classmethod
    def of(cls, record: KafkaRecord) -> RecordMeta:
        return cls(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            timestamp_ms=record.timestamp,
            headers=tuple(record.headers),
        )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record bound for a dead-letter topic, ready to send as is."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def dead_letter(record: KafkaRecord, *, code: str, reason: str, source_service: str) -> DeadLetter:
    """The dead-letter copy of ``record``: same bytes, same key, original headers kept, reasons added.

    ``reason`` is a sentence for people, ``code`` a stable token for machines, ``source_service``
    the service that gave up on the record.
    """
    headers = [*record.headers]
    headers += [
        (DLQ_REASON, reason.encode()),
        (DLQ_CODE, code.encode()),
        (DLQ_TOPIC, record.topic.encode()),
        (DLQ_PARTITION, str(record.partition).encode()),
        (DLQ_OFFSET, str(record.offset).encode()),
        (DLQ_SOURCE_SERVICE, source_service.encode()),
    ]
    return DeadLetter(
        topic=dead_letter_topic(record.topic), key=record.key, value=record.value, headers=headers
    )


def header(headers: Sequence[tuple[str, bytes]], name: str) -> bytes | None:
    """The last value of header ``name`` (Kafka allows repeats; the latest word wins), or None."""
    found = [value for key, value in headers if key == name]
    return found[-1] if found else None
