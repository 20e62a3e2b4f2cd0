"""The ``__main__`` of every service: logging, tracing, SIGTERM handling, exit status."""

from __future__ import annotations

import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gangline.bus import run_service
from gangline.telemetry import setup_logging, setup_tracing
from services.common.env import ServiceSettings

S = TypeVar("S", bound=ServiceSettings)


def run_main(service: str, settings: S, main: Callable[[S], Coroutine[Any, Any, object]]) -> int:
    """Run ``main(settings)`` as the process's service until it ends or SIGTERM/SIGINT; the exit status.

    A ``__main__`` that turned the garbage collector off for its imports has it on again here, with what
    the imports left frozen out of its reach (they live as long as the process): no collection walks the
    modules, classes and schemas again, the one after a restore (``settle_garbage_collector``) included.
    """
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
    setup_logging(service, level=settings.log_level)
    # Without a collector the SDK would record every span for nobody: setup_tracing then installs the
    # light provider, which records nothing but still gives every hop its own span id under the job's
    # trace (and starts one for a producer that sent none), at a fifth of the SDK's cost per span.
    setup_tracing(service, otlp_endpoint=settings.otlp_endpoint, instance_id=settings.instance_id)
    status: int = run_service(main(settings))
    return status
