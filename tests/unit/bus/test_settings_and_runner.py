from __future__ import annotations

import asyncio
import os
import signal
from datetime import UTC, datetime
from typing import ClassVar

import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError

from gangline.bus import ProcessorSettings, serve
from gangline.bus.producer import stamped
from gangline.events.base import Event, make_envelope
from gangline.telemetry import span_context_of


class Ping(Event):
    TYPE: ClassVar[str] = "test.ping"
    VERSION: ClassVar[int] = 1
    job_id: str

    def subject(self) -> str:
        return self.job_id


def _settings(**overrides: object) -> ProcessorSettings:
    values: dict[str, object] = {
        "bootstrap_servers": "127.0.0.1:9092",
        "service": "admission",
        "instance_id": "admission-0",
        "group_id": "gangline.admission",
        "input_topics": ("jobs.requests",),
    }
    values.update(overrides)
    return ProcessorSettings.model_validate(values)


def test_transactional_id_is_stable_per_group_and_instance() -> None:
    assert _settings().transactional_id == "gangline.admission.admission-0"
    assert _settings(instance_id="admission-1").transactional_id != _settings().transactional_id


def test_settings_need_topics_and_are_frozen() -> None:
    with pytest.raises(ValidationError):
        _settings(input_topics=())
    settings = _settings()
    with pytest.raises(ValidationError):
        settings.service = "other"  # type: ignore[misc]


def test_stamped_envelope_carries_the_current_span() -> None:
    env = make_envelope(Ping(job_id="j1"), event_id="e1", source="t", time=datetime(2025, 1, 1, tzinfo=UTC))
    assert stamped(env) is env
    with TracerProvider().get_tracer("t").start_as_current_span("send") as span:
        out = stamped(env)
    assert out.traceparent is not None
    assert (
        span_context_of([("traceparent", out.traceparent.encode())]).span_id
        == span.get_span_context().span_id
    )
    assert out.model_dump(exclude={"traceparent"}) == env.model_dump(exclude={"traceparent"})


async def test_a_signal_cancels_main_which_cleans_up_and_exits_zero() -> None:
    cleaned = asyncio.Event()
    running = asyncio.Event()

    async def main() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    serving = asyncio.ensure_future(serve(main(), signals=(signal.SIGUSR1,)))
    await running.wait()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert await serving == 0
    assert cleaned.is_set()


async def test_main_that_fails_exits_one_and_one_that_returns_exits_zero() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def returns() -> None:
        return None

    assert await serve(fails(), signals=(signal.SIGUSR1,)) == 1
    assert await serve(returns(), signals=(signal.SIGUSR1,)) == 0
