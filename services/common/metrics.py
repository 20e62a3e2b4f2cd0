"""What every decision service serves at ``/metrics``, and the hooks its shell feeds.

A :class:`ServiceMetrics` holds the service's registry (families from
:data:`gangline.telemetry.metrics.FAMILIES`): decisions by event type and the time each took (fed by
the shell's :class:`~services.common.shell.Replayed`, on fresh decisions only: a retried batch's
replayed outputs are not counted twice), and, read from the running
:class:`~gangline.bus.Processor` at scrape time, transactions, dead letters and consumer lag. A
service adds its own gauges (:meth:`ServiceMetrics.add_figures`, computed from its fold at scrape
time) and observes its own histograms from the outputs it decided (:meth:`ServiceMetrics.on_decided`).

The same server answers the probes: ``/healthz`` while the event loop runs, and ``/readyz`` from the
service's :attr:`ServiceMetrics.phase`: ready as a standby waiting for the leadership (it takes over
when the leader dies) and once its state is restored from the log and it processes (caught up to the
end of the log as it stood at start); not ready while it starts, fences or restores.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from prometheus_client import Counter, Histogram
from prometheus_client.core import Metric

from gangline.bus import Outgoing, Processor
from gangline.telemetry.metrics import (
    CYCLE_BUCKETS,
    WAIT_BUCKETS,
    Figures,
    counter,
    counting,
    gauge,
    histogram,
    new_registry,
    serving,
)
from services.common.env import ServiceSettings

OnDecided = Callable[[Sequence[Outgoing]], None]
Phase = Literal["starting", "standby", "restoring", "processing", "serving"]
_READY: dict[Phase, str | None] = {
    "starting": None,
    "standby": "a standby, waiting for the leadership",
    "restoring": None,
    "processing": "processing, its state restored from the log",
    "serving": "serving",
}
_NOT_READY = {"starting": "starting", "restoring": "restoring its state from the log"}


class ServiceMetrics:
    """One service's registry and the families every decision service serves (``decides`` False: only
    the process families and what the service adds, for the ledger, the API and the agents)."""

    def __init__(self, service: str, *, process: bool = True, decides: bool = True) -> None:
        self.service = service
        self.registry = new_registry(process=process)
        self.port: int | None = None
        """The port served on, once :meth:`serve` bound it."""
        self.processor: Processor | None = None
        self.phase: Phase = "starting" if decides else "serving"
        """Where the service is (services.common.shell sets it); ``/readyz`` answers from it."""
        self._on_decided: list[OnDecided] = []
        self._decisions: Counter | None = None
        self._cycle: Histogram | None = None
        if decides:
            self._decisions = counting(self.registry, "gangline_decisions_total")
            self._cycle = histogram(self.registry, "gangline_cycle_seconds", CYCLE_BUCKETS)
            self.registry.register(Figures(self._processor_figures))

    def readiness(self) -> tuple[bool, str]:
        """Ready (standby or processing) or not (starting, restoring), and what it is doing."""
        ready = _READY[self.phase]
        return (True, ready) if ready is not None else (False, _NOT_READY[self.phase])

    def watch(self, processor: Processor) -> None:
        """Read transactions, dead letters and lag from ``processor`` from now on (the latest one wins)."""
        self.processor = processor

    def add_figures(self, compute: Callable[[], Iterable[Metric]]) -> None:
        """Families computed at scrape time (from the service's fold)."""
        self.registry.register(Figures(compute))

    def on_decided(self, hook: OnDecided) -> None:
        """Call ``hook`` with the outputs of every fresh decision (to observe the service's histograms)."""
        self._on_decided.append(hook)

    def first_waits(
        self, family: str, event: type[Any], admitted_at: Callable[[Any], datetime | None]
    ) -> None:
        """Observe the histogram ``family`` ``{queue}`` for every decided output of type ``event``: the
        seconds since its job's admission, which ``admitted_at`` reads off the service's fold (None when
        the job is unknown or this is not its first such output: a requeued job's later ones would count
        its run time as waiting)."""
        waits = histogram(self.registry, family, WAIT_BUCKETS)

        def observe(outputs: Sequence[Outgoing]) -> None:
            for _, envelope in outputs:
                data = envelope.data
                if not isinstance(data, event):
                    continue
                since = admitted_at(data)
                if since is not None:
                    waits.labels(data.queue).observe(max(0.0, (envelope.time - since).total_seconds()))

        self.on_decided(observe)

    def decided(self, outputs: Sequence[Outgoing], seconds: float | None) -> None:
        """One fresh decision (an event, or a batch's cycle) made ``outputs`` in ``seconds`` (None: not
        timed, an event folded ahead of its batch's cycle)."""
        if self._cycle is not None and seconds is not None:
            self._cycle.labels(self.service).observe(seconds)
        if self._decisions is not None and outputs:
            # One labelled child per type, not per output (labels() takes a lock and builds a key each call).
            counts: dict[str, int] = {}
            for _, envelope in outputs:
                kind = envelope.data.TYPE
                counts[kind] = counts.get(kind, 0) + 1
            for kind, count in counts.items():
                self._decisions.labels(self.service, kind).inc(count)
        for hook in self._on_decided:
            hook(outputs)

    @contextlib.asynccontextmanager
    async def serve(self, settings: ServiceSettings) -> AsyncIterator[int | None]:
        """Serve ``/metrics`` on the settings' host and port while the block runs."""
        async with serving(
            self.registry, host=settings.metrics_host, port=settings.metrics_port, readiness=self.readiness
        ) as port:
            self.port = port
            yield port

    def _processor_figures(self) -> Iterable[Metric]:
        processor = self.processor
        transactions = counter("gangline_transactions_total")
        letters = counter("gangline_dead_letters_total")
        lag = gauge("gangline_consumer_lag_records")
        if processor is not None:
            stats = processor.stats
            transactions.add_metric([self.service, "committed"], stats.batches_committed)
            transactions.add_metric([self.service, "aborted"], stats.batches_aborted)
            for (topic, code), count in sorted(stats.dead_letters.items()):
                letters.add_metric([topic, code], count)
            for topic, records in sorted(processor.consumer_lag().items()):
                lag.add_metric([self.service, topic], records)
        return [transactions, letters, lag]
