"""Envelopes for the services' tests on the real broker: unique ids, times from a fixed start."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from gangline.events.base import Envelope, Event, make_envelope

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def envelope(event: Event, at: float) -> Envelope:
    """``event`` as a test writes it, ``at`` seconds after T0 (a fresh id: the services dedupe by it)."""
    return make_envelope(event, event_id=uuid.uuid4().hex, source="test", time=T0 + timedelta(seconds=at))
