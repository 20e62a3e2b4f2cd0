"""The event base class and the CloudEvents 1.0 envelope every Kafka message travels in (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    model_validator,
)

WIRE_TYPE_RE = re.compile(
    r"^gangline\.(?P<type>[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*)\.v(?P<version>[1-9][0-9]*)$"
)
TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
JsonObject = dict[str, Any]
"""A JSON object as json.loads returns it."""
Upcaster = Callable[[JsonObject], JsonObject]
"""Turns the JSON ``data`` of version N of a type into the JSON ``data`` of version N + 1."""

MAX_ATTRIBUTE_CHARS = 512
"""The CloudEvents ``id``, ``source``, ``subject`` and ``causationid`` are at most this long (an output
repeats its cause's id: an unbounded one would let one request make events of any size)."""
Attribute = Annotated[str, Field(min_length=1, max_length=MAX_ATTRIBUTE_CHARS)]

EVENT_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*$")


def _as_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_as_utc)]
"""A timezone-aware instant normalised to UTC (naive datetimes are rejected); RFC 3339 "Z" on the wire."""


MODEL_CONFIG = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
"""Every payload and every part of one: immutable, closed to unknown fields, documented in its schema."""


class Event(BaseModel):
    """Base of every event payload: frozen, closed to unknown fields, named on the wire by TYPE and VERSION.

    A subclass sets ``TYPE`` (past tense, e.g. "job.requested") and ``VERSION`` and says in ``subject()``
    which field is the Kafka key (the job id or the node id).
    """

    model_config = MODEL_CONFIG

    TYPE: ClassVar[str]
    VERSION: ClassVar[int]

    @classmethod
    def wire_type(cls) -> str:
        """The CloudEvents ``type`` attribute, e.g. "gangline.job.requested.v1"."""
        return f"gangline.{cls.TYPE}.v{cls.VERSION}"

    def subject(self) -> str:
        """The job id or node id this event is about: the CloudEvents ``subject`` and the Kafka key."""
        raise NotImplementedError(f"{type(self).__name__} must say which field is its subject")


def parse_wire_type(wire_type: str) -> tuple[str, int] | None:
    """Split "gangline.job.requested.v1" into ("job.requested", 1); None when it is not a Gangline type."""
    match = WIRE_TYPE_RE.match(wire_type)
    if match is None:
        return None
    return match.group("type"), int(match.group("version"))


class Envelope(BaseModel):
    """One Kafka message: CloudEvents 1.0 structured mode with the typed payload under ``data``.

    ``type`` and ``subject`` always agree with ``data`` (checked on construction).
    """

    model_config = MODEL_CONFIG

    specversion: Literal["1.0"]
    id: Attribute
    """Unique per message: the idempotency key consumers deduplicate on."""
    source: Attribute
    """Who produced it, e.g. "gangline/placement" or "gangline/agent/node-07"."""
    type: str
    """gangline.<event>.v<N>"""
    time: UtcDatetime
    """When the event happened, RFC 3339 in UTC."""
    subject: Attribute
    """The job id or node id: also the Kafka key."""
    datacontenttype: Literal["application/json"] = "application/json"
    causationid: Attribute | None = None
    """The id of the event that caused this one."""
    traceparent: Annotated[str, Field(pattern=TRACEPARENT_PATTERN)] | None = None
    """W3C trace context, also carried in the Kafka headers."""
    data: SerializeAsAny[Event]

    @model_validator(mode="after")
    def _agrees_with_data(self) -> Self:
        if self.type != self.data.wire_type():
            raise ValueError(f"type {self.type!r} does not match data of type {self.data.wire_type()!r}")
        if self.subject != self.data.subject():
            raise ValueError(
                f"subject {self.subject!r} does not match the data's subject {self.data.subject()!r}"
            )
        return self


def make_envelope(
    data: Event,
    *,
    event_id: str,
    source: str,
    time: datetime,
    causationid: str | None = None,
    traceparent: str | None = None,
) -> Envelope:
    """Wrap a payload for the wire. Pure: the id and the time are given, never drawn here."""
    return Envelope(
        specversion="1.0",
        id=event_id,
        source=source,
        type=data.wire_type(),
        time=time,
        subject=data.subject(),
        causationid=causationid,
        traceparent=traceparent,
        data=data,
    )
