"""The services' tests on the real broker: envelopes (unique ids, times from a fixed start), a service's
settings on the test's topics, and the service running as a task."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from gangline.events.base import Envelope, Event, make_envelope
from services.common.topics import TopicNames

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def envelope(event: Event, at: float) -> Envelope:
    """``event`` as a test writes it, ``at`` seconds after T0 (a fresh id: the services dedupe by it)."""
    return make_envelope(event, event_id=uuid.uuid4().hex, source="test", time=T0 + timedelta(seconds=at))


def on_topics(bootstrap: str, topics: TopicNames) -> dict[str, Any]:
    """A service's settings for a test on ``topics``: its own consumer groups, replica ``i0``, no metrics."""
    return {
        "kafka_bootstrap": bootstrap,
        "topic_prefix": topics.prefix,
        "group_prefix": f"g-{topics.prefix.rstrip('.')}",
        "instance_id": "i0",
        "metrics_port": None,
    }


@contextlib.asynccontextmanager
async def running(service: Coroutine[Any, Any, None]) -> AsyncIterator[asyncio.Task[None]]:
    """``service`` (a service's ``main``) as a task of the test's loop, cancelled on the way out."""
    task = asyncio.create_task(service)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
