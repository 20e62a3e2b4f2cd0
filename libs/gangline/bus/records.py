"""What the bus hands a handler besides the event, and how a record is dead-lettered (pure).

A record that cannot be decoded, or that keeps failing its handler, is copied to the input
topic's dead-letter twin byte for byte, with its original key and headers, plus the
``gangline-dlq-*`` headers below saying why and where it came from.

A dead letter always fits the broker's 1 MiB record limit, whatever the record it copies: the
reason is cut to ``MAX_REASON_BYTES``; a value over ``MAX_VALUE_BYTES``, a key over
``MAX_KEY_BYTES`` and original headers over ``MAX_COPIED_HEADER_BYTES`` in all are cut, and then
``gangline-dlq-truncated`` names what was cut while ``gangline-dlq-value-sha256`` and
``gangline-dlq-value-size`` keep the digest and length of the whole value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gangline.events.topics import dead_letter_topic

DLQ_REASON = "gangline-dlq-reason"
DLQ_CODE = "gangline-dlq-code"
DLQ_TOPIC = "gangline-dlq-topic"
DLQ_PARTITION = "gangline-dlq-partition"
DLQ_OFFSET = "gangline-dlq-offset"
DLQ_SOURCE_SERVICE = "gangline-dlq-source-service"
DLQ_TRUNCATED = "gangline-dlq-truncated"
"""Comma-separated parts of the record cut to fit the limit: ``value``, ``key``, ``headers``."""
DLQ_VALUE_SHA256 = "gangline-dlq-value-sha256"
"""Hex SHA-256 of the whole original value (set when the value was cut)."""
DLQ_VALUE_SIZE = "gangline-dlq-value-size"
"""Length in bytes of the whole original value (set when the value was cut)."""

MAX_REASON_BYTES = 4096
"""The reason header is a sentence of at most this many UTF-8 bytes (cut on a character boundary)."""
MAX_VALUE_BYTES = 768 * 1024
MAX_KEY_BYTES = 4096
MAX_COPIED_HEADER_BYTES = 64 * 1024
"""Original headers (names and values) copied until this many bytes; the rest are left out."""
MAX_DEAD_LETTER_BYTES = MAX_VALUE_BYTES + MAX_KEY_BYTES + MAX_COPIED_HEADER_BYTES + 2 * MAX_REASON_BYTES
"""What a dead letter may weigh at most (value, key and headers): well under the broker's 1 MiB."""

HANDLER_FAILED = "handler_failed"
"""The DLQ code of a record whose handler kept raising (decode failures use the DecodeError codes)."""
PROCESSING_FAILED = "processing_failed"
"""The DLQ code of a record that kept failing outside its handler (a bug in decoding, flushing, ...)."""
OUTPUT_TOO_LARGE = "output_too_large"
"""The DLQ code of a record whose outputs (or dead letter) the broker refused as too large."""


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
    full_value: bytes | None = field(default=None, repr=False, compare=False)
    """The record's whole value when ``value`` was cut (never sent): for whoever answers the record's
    producer (to read the job id out of it), not for the dead-letter topic."""

    @property
    def code(self) -> str:
        """Why it was dead-lettered, in one word (its ``gangline-dlq-code`` header; the last one wins)."""
        codes = [value for name, value in self.headers if name == DLQ_CODE]
        return codes[-1].decode(errors="replace") if codes else "unknown"

    @property
    def original_value(self) -> bytes | None:
        """The value of the record that was dead-lettered, whole."""
        return self.full_value if self.full_value is not None else self.value


def dead_letter(record: KafkaRecord, *, code: str, reason: str, source_service: str) -> DeadLetter:
    """The dead-letter copy of ``record``: same bytes, same key, original headers kept, reasons added.

    ``reason`` is a sentence for people, ``code`` a stable token for machines, ``source_service``
    the service that gave up on the record. Whatever is too large is cut (module docstring).
    """
    truncated: list[str] = []
    value = full_value = record.value
    digest: list[tuple[str, bytes]] = []
    if value is not None and len(value) > MAX_VALUE_BYTES:
        digest = [
            (DLQ_VALUE_SHA256, hashlib.sha256(value).hexdigest().encode()),
            (DLQ_VALUE_SIZE, str(len(value)).encode()),
        ]
        value = value[:MAX_VALUE_BYTES]
        truncated.append("value")
    key = record.key
    if key is not None and len(key) > MAX_KEY_BYTES:
        key = key[:MAX_KEY_BYTES]
        truncated.append("key")
    headers: list[tuple[str, bytes]] = []
    room = MAX_COPIED_HEADER_BYTES
    for name, content in record.headers:
        size = len(name.encode()) + len(content)
        if size > room:
            truncated.append("headers")
            break
        headers.append((name, content))
        room -= size
    headers += [
        (DLQ_REASON, _cut(reason, MAX_REASON_BYTES)),
        (DLQ_CODE, _cut(code, 64)),
        (DLQ_TOPIC, record.topic.encode()),
        (DLQ_PARTITION, str(record.partition).encode()),
        (DLQ_OFFSET, str(record.offset).encode()),
        (DLQ_SOURCE_SERVICE, _cut(source_service, 256)),
    ]
    if truncated:
        headers += [(DLQ_TRUNCATED, ",".join(truncated).encode()), *digest]
    return DeadLetter(
        topic=dead_letter_topic(record.topic),
        key=key,
        value=value,
        headers=headers,
        full_value=full_value if "value" in truncated else None,
    )


def _cut(text: str, limit: int) -> bytes:
    """``text`` as UTF-8 in at most ``limit`` bytes, cut on a character boundary and marked with "…"."""
    raw = text.encode()
    if len(raw) <= limit:
        return raw
    ellipsis = "…".encode()
    return raw[: limit - len(ellipsis)].decode(errors="ignore").encode() + ellipsis


def header(headers: Sequence[tuple[str, bytes]], name: str) -> bytes | None:
    """The last value of header ``name`` (Kafka allows repeats; the latest word wins), or None."""
    found = [value for key, value in headers if key == name]
    return found[-1] if found else None
