from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from pydantic import Field

from gangline.bus import (
    DLQ_CODE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_SOURCE_SERVICE,
    DLQ_TOPIC,
    DLQ_TRUNCATED,
    DLQ_VALUE_SHA256,
    DLQ_VALUE_SIZE,
    MAX_DEAD_LETTER_BYTES,
    DeadLetter,
    RecordMeta,
    dead_letter,
    decode_or_dead_letter,
    header,
)
from gangline.events.base import Event, make_envelope
from gangline.events.codec import encode
from gangline.events.registry import Registry


class Ping(Event):
    TYPE: ClassVar[str] = "test.ping"
    VERSION: ClassVar[int] = 1
    job_id: str
    n: int = Field(ge=0)

    def subject(self) -> str:
        return self.job_id


REGISTRY = Registry([Ping])


@dataclass(frozen=True)
class Record:
    value: bytes | None
    topic: str = "jobs.requests"
    partition: int = 2
    offset: int = 41
    timestamp: int = 1_740_000_000_000
    key: bytes | None = b"j1"
    headers: tuple[tuple[str, bytes], ...] = field(default_factory=tuple)


def _valid_bytes() -> bytes:
    from datetime import UTC, datetime

    env = make_envelope(
        Ping(job_id="j1", n=1), event_id="e1", source="test", time=datetime(2025, 1, 1, tzinfo=UTC)
    )
    return encode(env)


def test_dead_letter_copies_bytes_key_and_headers_and_says_why() -> None:
    record = Record(value=b"\x00garbage", headers=(("traceparent", b"00-abc"), ("origin", b"api")))
    letter = dead_letter(record, code="malformed_message", reason="not JSON", source_service="admission")
    assert letter.topic == "jobs.requests.dlq"
    assert letter.value == b"\x00garbage"
    assert letter.key == b"j1"
    assert letter.headers[:2] == [("traceparent", b"00-abc"), ("origin", b"api")]
    assert dict(letter.headers[2:]) == {
        DLQ_REASON: b"not JSON",
        DLQ_CODE: b"malformed_message",
        DLQ_TOPIC: b"jobs.requests",
        DLQ_PARTITION: b"2",
        DLQ_OFFSET: b"41",
        DLQ_SOURCE_SERVICE: b"admission",
    }


def test_reason_is_utf8_and_header_lookup_takes_the_last_value() -> None:
    record = Record(value=b"x", headers=((DLQ_REASON, b"an earlier failure"),))
    letter = dead_letter(record, code="handler_failed", reason="quota für team-nlp", source_service="quota")
    assert header(letter.headers, DLQ_REASON) == "quota für team-nlp".encode()
    assert header(letter.headers, "absent") is None


@pytest.mark.parametrize(
    ("value", "code", "reason_part"),
    [
        (b"\xff\xfe garbage", "malformed_message", "not UTF-8"),
        (b"{not json", "malformed_message", "not JSON"),
        (None, "malformed_message", "tombstone"),
    ],
)
def test_unreadable_records_become_dead_letters(value: bytes | None, code: str, reason_part: str) -> None:
    outcome = decode_or_dead_letter(Record(value=value), registry=REGISTRY, source_service="admission")
    assert isinstance(outcome, DeadLetter)
    assert header(outcome.headers, DLQ_CODE) == code.encode()
    assert reason_part in (header(outcome.headers, DLQ_REASON) or b"").decode()
    assert outcome.value == value


def test_schema_violation_names_the_field() -> None:
    body = json.loads(_valid_bytes())
    body["data"]["n"] = -3
    raw = json.dumps(body).encode()
    outcome = decode_or_dead_letter(Record(value=raw), registry=REGISTRY, source_service="admission")
    assert isinstance(outcome, DeadLetter)
    assert header(outcome.headers, DLQ_CODE) == b"schema_violation"
    assert b"data.n" in (header(outcome.headers, DLQ_REASON) or b"")
    assert outcome.value == raw


def test_unknown_type_is_dead_lettered_with_its_code() -> None:
    outcome = decode_or_dead_letter(Record(value=_valid_bytes()), registry=Registry([]), source_service="q")
    assert isinstance(outcome, DeadLetter)
    assert header(outcome.headers, DLQ_CODE) == b"unknown_event_type"


def test_readable_record_decodes_and_meta_says_where_it_was() -> None:
    record = Record(value=_valid_bytes(), headers=(("traceparent", b"00-x"),))
    outcome = decode_or_dead_letter(record, registry=REGISTRY, source_service="admission")
    assert not isinstance(outcome, DeadLetter)
    assert outcome.data == Ping(job_id="j1", n=1)
    meta = RecordMeta.of(record)
    assert (meta.topic, meta.partition, meta.offset, meta.key) == ("jobs.requests", 2, 41, b"j1")
    assert meta.headers == (("traceparent", b"00-x"),)


def _weight(letter: DeadLetter) -> int:
    """What the record weighs on the wire, but for Kafka's few bytes of framing."""
    headers = sum(len(name.encode()) + len(value) for name, value in letter.headers)
    return len(letter.value or b"") + len(letter.key or b"") + headers


def test_a_huge_record_makes_a_dead_letter_under_the_limit_keeping_the_digest_of_its_value() -> None:
    value = bytes(range(256)) * 4096  # 1 MiB of garbage
    record = Record(value=value, key=b"k" * 900_000, headers=(("big", b"h" * 900_000), ("small", b"s")))
    letter = dead_letter(record, code="malformed_message", reason="r" * 900_000, source_service="ledger")
    assert _weight(letter) <= MAX_DEAD_LETTER_BYTES < 1024 * 1024
    assert letter.value == value[: len(letter.value or b"")] and len(letter.value or b"") < len(value)
    assert header(letter.headers, DLQ_VALUE_SHA256) == hashlib.sha256(value).hexdigest().encode()
    assert header(letter.headers, DLQ_VALUE_SIZE) == str(len(value)).encode()
    assert header(letter.headers, DLQ_TRUNCATED) == b"value,key,headers"
    assert header(letter.headers, "big") is None  # left out: over the room for copied headers
    assert len(header(letter.headers, DLQ_REASON) or b"") <= 4096
    assert header(letter.headers, DLQ_CODE) == b"malformed_message"


def test_a_small_record_is_copied_whole_with_no_digest() -> None:
    letter = dead_letter(Record(value=b"tiny"), code="malformed_message", reason="x", source_service="a")
    assert letter.value == b"tiny"
    assert header(letter.headers, DLQ_TRUNCATED) is None and header(letter.headers, DLQ_VALUE_SHA256) is None


def test_the_reason_is_cut_on_a_character_boundary() -> None:
    letter = dead_letter(Record(value=b"x"), code="c", reason="é" * 5000, source_service="a")
    reason = (header(letter.headers, DLQ_REASON) or b"").decode()  # still valid UTF-8
    assert len(reason.encode()) <= 4096 and reason.endswith("…") and set(reason[:-1]) == {"é"}


def test_a_900_kb_subject_makes_a_small_reason_and_a_bounded_dead_letter() -> None:
    body = json.loads(_valid_bytes())
    body["subject"] = "s" * 900_000
    raw = json.dumps(body).encode()
    outcome = decode_or_dead_letter(Record(value=raw), registry=REGISTRY, source_service="admission")
    assert isinstance(outcome, DeadLetter)
    assert header(outcome.headers, DLQ_CODE) in (b"schema_violation", b"malformed_message")
    assert len(header(outcome.headers, DLQ_REASON) or b"") < 1000
    assert _weight(outcome) <= MAX_DEAD_LETTER_BYTES


def test_json_nested_10000_deep_is_a_malformed_message_not_a_recursion_error() -> None:
    for raw in (b"[" * 10_000 + b"]" * 10_000, b'{"data":' * 10_000 + b"1" + b"}" * 10_000):
        outcome = decode_or_dead_letter(Record(value=raw), registry=REGISTRY, source_service="admission")
        assert isinstance(outcome, DeadLetter)
        assert header(outcome.headers, DLQ_CODE) == b"malformed_message"
        assert b"64 levels" in (header(outcome.headers, DLQ_REASON) or b"")
