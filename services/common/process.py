"""The ``__main__`` of every service: logging, tracing, SIGTERM handling, exit status."""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gangline.bus import run_service
from gangline.telemetry import setup_logging, setup_tracing, traces_endpoint
from services.common.env import ServiceSettings

S = TypeVar("S", bound=ServiceSettings)


def run_main(service: str, settings: S, main: Callable[[S], Coroutine[Any, Any, object]]) -> int:
    """Run ``main(settings)`` as the process's service until it ends or SIGTERM/SIGINT; the exit status."""
    setup_logging(service, level=settings.log_level)
    # Without a collector the SDK would record every span for nobody: the API's no-op tracer still
    # carries the producer's trace context from input to output, at a fraction of the cost.
    if traces_endpoint(settings.otlp_endpoint, os.environ) is not None:
        setup_tracing(service, otlp_endpoint=settings.otlp_endpoint, instance_id=settings.instance_id)
    status: int = run_service(main(settings))
    return status
