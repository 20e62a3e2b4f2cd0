"""Process entry point for services: run the main coroutine, stop cleanly on SIGTERM/SIGINT.

Usage in ``services/<name>/__main__.py``::

    raise SystemExit(run_service(main(settings)))

On the first SIGTERM or SIGINT the main task is cancelled. A :class:`~gangline.bus.processor.Processor`
inside it aborts its in-flight transaction (or finishes a commit already under way), stops its
consumer and producer, and the process exits 0. Anything the main coroutine raises exits 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine, Sequence
from typing import Any

log = logging.getLogger(__name__)

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def serve(
    main: Coroutine[Any, Any, object], *, signals: Sequence[signal.Signals] = SHUTDOWN_SIGNALS
) -> int:
    """Await ``main`` with signal handlers installed; the exit status (0 clean, 1 failed)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main)
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if not received:
            log.info("shutting down on %s", sig.name)
            task.cancel()
        received.append(sig)

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await task
    except asyncio.CancelledError:
        if not received:
            raise
    except Exception:
        log.exception("service failed")
        return 1
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    return 0


def run_service(main: Coroutine[Any, Any, object]) -> int:
    """Run ``main`` in a fresh event loop until it ends or a shutdown signal; the exit status."""
    return asyncio.run(serve(main))
