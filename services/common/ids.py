"""What tells a retried record from another that reuses its event id (derived ids: gangline.events.ids)."""

from __future__ import annotations

from gangline.events.base import Envelope, Event

Fingerprint = tuple[str, Event, str, int, int]
"""What tells a retried record (an aborted batch read again) from another that reuses its event id: the
event's type and (frozen) data, and where it was read (topic, partition, offset)."""


def fingerprint(envelope: Envelope, topic: str, partition: int, offset: int) -> Fingerprint:
    return (envelope.type, envelope.data, topic, partition, offset)
