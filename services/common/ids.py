"""Deterministic event and allocation ids: a retried transaction produces the same ids again."""

from __future__ import annotations

import uuid

from gangline.events.base import Envelope, Event

_NAMESPACE = uuid.UUID("2b8f6d0e-5c1a-4f7e-9a3d-8e4b1c6f0a25")


def derived_id(cause_id: str, *parts: object) -> str:
    """The id of an event caused by ``cause_id``; ``parts`` tell apart several outputs of one cause."""
    return str(uuid.uuid5(_NAMESPACE, "/".join([cause_id, *map(str, parts)])))


Fingerprint = tuple[str, Event, str, int, int]
"""What tells a retried record (an aborted batch read again) from another that reuses its event id: the
event's type and (frozen) data, and where it was read (topic, partition, offset)."""


def fingerprint(envelope: Envelope, topic: str, partition: int, offset: int) -> Fingerprint:
    return (envelope.type, envelope.data, topic, partition, offset)
