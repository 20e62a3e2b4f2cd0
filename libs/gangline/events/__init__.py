"""The event contracts: frozen, versioned payloads in a CloudEvents envelope, their codec and registry (pure).

Producers: ``encode(make_envelope(JobRequested(...), event_id=..., source=..., time=...))``.
Consumers: ``env = decode(raw)``; ``env.data`` is the typed payload at its latest version, or a
``DecodeError`` (``.code``, ``.reason``) says why the message goes to the dead-letter topic.
"""

from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import (
    DecodeError,
    MalformedMessage,
    SchemaViolation,
    UnknownEventType,
    decode,
    encode,
)
from gangline.events.registry import Registry, default_registry

__all__ = [
    "DecodeError",
    "Envelope",
    "Event",
    "MalformedMessage",
    "Registry",
    "SchemaViolation",
    "UnknownEventType",
    "decode",
    "default_registry",
    "encode",
    "make_envelope",
]
