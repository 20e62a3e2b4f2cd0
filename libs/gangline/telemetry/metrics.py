"""Prometheus metrics: the catalogue of every family the services serve, and ``/metrics`` over asyncio.

:data:`FAMILIES` is the one list of metric names, their labels and who serves them: the services
build their families from it (:func:`gauge`, :func:`counter`, :func:`histogram`), the README's table
says the same, and the Grafana dashboard's test checks every expression against it.

Each service has a registry of its own (several run in one process in tests), served on its own port
by :class:`MetricsServer` (a few lines of HTTP on asyncio: no thread, so collectors read the service's
state between two of its awaits, never half-way through a fold). Gauges are computed from the state at
scrape time; counters and histograms are kept as the service decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

Kind = Literal["gauge", "counter", "histogram"]

METRICS_PORTS = {
    "admission": 9471,
    "quota": 9472,
    "placement": 9473,
    "preemption": 9474,
    "node_health": 9475,
    "ledger": 9476,
    "api": 9477,
    "agent": 9478,
    "analytics": 8091,  # the faust app serves /metrics beside its /analytics JSON (GANGLINE_ANALYTICS_PORT)
}
"""Each service's default ``/metrics`` port (``GANGLINE_METRICS_PORT`` overrides it)."""

DECISION_SERVICES = ("admission", "quota", "placement", "preemption", "node_health")
CONSUMERS = (*DECISION_SERVICES, "ledger")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: its exposed name (counters end in ``_total``), type, labels and servers."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    services: tuple[str, ...]
    dcgm: str | None = None
    """The DCGM exporter field this one corresponds to (agent GPU families)."""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "gangline_jobs",
            "gauge",
            ("queue", "state"),
            "Jobs by state: waiting (admitted, held by quota), pending (cleared by quota, waiting for "
            "GPUs), running, preempting (asked to checkpoint)",
            ("placement",),
        ),
        Family(
            "gangline_pending_jobs",
            "gauge",
            ("queue", "reason"),
            "Jobs waiting for GPUs by the first reason placement last gave (none: no cycle yet)",
            ("placement",),
        ),
        Family(
            "gangline_admission_wait_seconds",
            "histogram",
            ("queue",),
            "From admission (job.admitted) to quota letting the job through (job.queued)",
            ("quota",),
        ),
        Family(
            "gangline_request_to_grant_seconds",
            "histogram",
            ("queue",),
            "From admission (job.admitted) to the grant of its GPUs (allocation.granted)",
            ("placement",),
        ),
        Family(
            "gangline_decisions_total",
            "counter",
            ("service", "kind"),
            "Events a service decided, by event type",
            DECISION_SERVICES,
        ),
        Family(
            "gangline_cycle_seconds",
            "histogram",
            ("service",),
            "Time to decide on one event, or one batch (placement's scheduling cycle)",
            DECISION_SERVICES,
        ),
        Family(
            "gangline_quota_gpus",
            "gauge",
            ("queue", "gpu_model", "kind"),
            "Quota per queue and resource: nominal, used, borrowed (beyond nominal), lent (its idle "
            "nominal used by its cohort, shared out in proportion to what each queue leaves idle)",
            ("quota",),
        ),
        Family(
            "gangline_fair_share",
            "gauge",
            ("queue",),
            "Quota's dominant (DRF) share over decayed usage, divided by the weight: lowest is served first",
            ("quota",),
        ),
        Family(
            "gangline_gpus",
            "gauge",
            ("gpu_model", "state"),
            "GPUs by state: free, allocated, cordoned (node failed or GPU failed), degraded",
            ("placement",),
        ),
        Family(
            "gangline_fragmented_gpus",
            "gauge",
            ("gpu_model",),
            "Free GPUs no waiting job's worker fits on (0 while nothing waits)",
            ("placement",),
        ),
        Family(
            "gangline_preemptions_total",
            "counter",
            ("queue", "reason"),
            "Running jobs asked to give their GPUs back (reason: priority or reclaim), by the victim's queue",
            ("preemption",),
        ),
        Family(
            "gangline_gpu_hours_lost_total",
            "counter",
            ("queue",),
            "GPU-hours of work since the last checkpoint thrown away by preemptions",
            ("preemption",),
        ),
        Family(
            "gangline_consumer_lag_records",
            "gauge",
            ("service", "topic"),
            "Records past the group's committed offsets (as kafka-consumer-groups.sh counts them)",
            CONSUMERS,
        ),
        Family(
            "gangline_dead_letters_total",
            "counter",
            ("topic", "reason"),
            "Records copied to a dead-letter topic, by that topic and the code of why",
            CONSUMERS,
        ),
        Family(
            "gangline_transactions_total",
            "counter",
            ("service", "result"),
            "Kafka transactions of the consume-process-produce loop: committed or aborted",
            DECISION_SERVICES,
        ),
        Family(
            "gangline_http_requests_total",
            "counter",
            ("method", "route", "code"),
            "HTTP requests the API answered",
            ("api",),
        ),
        Family(
            "gangline_gpu_xid_errors_total",
            "counter",
            ("node", "gpu", "xid"),
            "XID errors NVML reported",
            ("agent",),
            dcgm="DCGM_FI_DEV_XID_ERRORS",
        ),
        Family(
            "gangline_gpu_ecc_errors",
            "gauge",
            ("node", "gpu", "kind", "counter"),
            "ECC errors (kind: corrected, uncorrected; counter: volatile since reset, aggregate lifetime)",
            ("agent",),
            dcgm="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL / _DBE_VOL_TOTAL / _SBE_AGG_TOTAL / _DBE_AGG_TOTAL",
        ),
        Family(
            "gangline_gpu_remapped_rows",
            "gauge",
            ("node", "gpu", "kind"),
            "Remapped memory rows (kind: correctable, uncorrectable)",
            ("agent",),
            dcgm="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS / DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        ),
        Family(
            "gangline_gpu_row_remap_pending",
            "gauge",
            ("node", "gpu"),
            "1 while a row remap waits for a GPU reset",
            ("agent",),
            dcgm="DCGM_FI_DEV_ROW_REMAP_PENDING",
        ),
        Family(
            "gangline_gpu_temperature_celsius",
            "gauge",
            ("node", "gpu"),
            "GPU core temperature",
            ("agent",),
            dcgm="DCGM_FI_DEV_GPU_TEMP",
        ),
        Family(
            "gangline_analytics_gpu_hours",
            "gauge",
            ("queue", "gpu_model", "window"),
            "GPU-hours of ended allocation time in the current window (hour, day)",
            ("analytics",),
        ),
        Family(
            "gangline_analytics_utilisation_ratio",
            "gauge",
            ("queue", "gpu_model", "window"),
            "GPU-hours in the current window over the registered GPUs of the model times the window",
            ("analytics",),
        ),
        Family(
            "gangline_analytics_wait_seconds",
            "gauge",
            ("queue", "gpu_model", "quantile"),
            "Wait before a grant over the last day (hopping window), by quantile",
            ("analytics",),
        ),
        Family(
            "gangline_analytics_preemptions",
            "gauge",
            ("queue", "gpu_model"),
            "Preemptions today (UTC)",
            ("analytics",),
        ),
        Family(
            "gangline_analytics_gpu_hours_lost",
            "gauge",
            ("queue", "gpu_model"),
            "GPU-hours lost to preemption today (UTC), since each victim's last checkpoint",
            ("analytics",),
        ),
        Family(
            "gangline_analytics_jobs_ended",
            "gauge",
            ("queue", "gpu_model", "state"),
            "Jobs that ended today (UTC), by final state",
            ("analytics",),
        ),
        Family(
            "gangline_analytics_running_gpus",
            "gauge",
            ("queue", "gpu_model"),
            "GPUs held now",
            ("analytics",),
        ),
        Family(
            "gangline_analytics_undecodable_records_total",
            "counter",
            (),
            "Input records the analytics app did not decode (skipped)",
            ("analytics",),
        ),
    )
}
"""Every family a service serves (besides the client library's process_* and python_* ones)."""

WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
"""Seconds: waits for quota and GPUs run from sub-second to a day."""
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
"""Seconds: one decision is sub-millisecond, a scheduling cycle over a big cluster up to seconds."""


def exposed_names(family: Family) -> tuple[str, ...]:
    """The sample names a family's series appear under (a histogram's ``_bucket``, ``_sum``, ``_count``)."""
    if family.kind == "histogram":
        return tuple(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return (family.name,)


def _family(name: str, kind: Kind) -> Family:
    family = FAMILIES[name]
    if family.kind != kind:
        raise ValueError(f"{name} is a {family.kind}, not a {kind}")
    return family


def gauge(name: str) -> GaugeMetricFamily:
    """A gauge family of the catalogue, to fill at scrape time (``add_metric(labels, value)``)."""
    family = _family(name, "gauge")
    return GaugeMetricFamily(family.name, family.help, labels=family.labels)


def counter(name: str) -> CounterMetricFamily:
    """A counter family of the catalogue (name ending in ``_total``), to fill at scrape time."""
    family = _family(name, "counter")
    return CounterMetricFamily(family.name.removesuffix("_total"), family.help, labels=family.labels)


def counting(registry: CollectorRegistry, name: str) -> Counter:
    """A counter of the catalogue in ``registry``, counted as the service decides."""
    family = _family(name, "counter")
    return Counter(family.name.removesuffix("_total"), family.help, family.labels, registry=registry)


def histogram(registry: CollectorRegistry, name: str, buckets: Sequence[float]) -> Histogram:
    """A histogram of the catalogue in ``registry``, observed as the service decides."""
    family = _family(name, "histogram")
    return Histogram(family.name, family.help, family.labels, registry=registry, buckets=tuple(buckets))


class Figures(Collector):
    """A collector computing its families at scrape time from a function of the service's state."""

    def __init__(self, compute: Callable[[], Iterable[Metric]]) -> None:
        self._compute = compute

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self._compute())
        except Exception:
            # A scrape must never take the service down; an SRE sees the gap and the log line.
            log.exception("computing metrics failed")
            return []

    def describe(self) -> Iterable[Metric]:
        return []


def new_registry(*, process: bool = True) -> CollectorRegistry:
    """A registry of its own, with the process, platform and garbage-collector families (``process``)."""
    registry = CollectorRegistry(auto_describe=False)
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


Readiness = Callable[[], tuple[bool, str]]
"""Whether the process is ready for its work now, and a sentence saying what it is doing."""


def always_ready() -> tuple[bool, str]:
    return True, "serving"


class MetricsServer:
    """Serves ``GET /metrics`` (Prometheus text) of one registry on ``host:port`` (0: any free port),
    and the probes: ``/healthz`` (alive: the event loop answers) and ``/readyz`` (200 when
    ``readiness`` says ready, 503 with its reason when not)."""

    def __init__(
        self, registry: CollectorRegistry, *, host: str, port: int, readiness: Readiness = always_ready
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.readiness = readiness
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, _, rest = request.partition(b" ")
            path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                status, body, kind = "405 Method Not Allowed", b"GET only\n", "text/plain"
            elif path == b"/metrics":
                status, body, kind = "200 OK", generate_latest(self.registry), CONTENT_TYPE_LATEST
            elif path in (b"/", b"/healthz"):
                status, body, kind = "200 OK", b"ok: /metrics\n", "text/plain"
            elif path == b"/readyz":
                ready, why = self.readiness()
                status = "200 OK" if ready else "503 Service Unavailable"
                body, kind = f"{'ready' if ready else 'not ready'}: {why}\n".encode(), "text/plain"
            else:
                status, body, kind = "404 Not Found", b"not found: /metrics\n", "text/plain"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            writer.write(head if method == b"HEAD" else head + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def serving(
    registry: CollectorRegistry, *, host: str, port: int | None, readiness: Readiness = always_ready
) -> AsyncIterator[int | None]:
    """Serve ``registry`` while the block runs; yields the port (None: off, or the port was taken).

    A port that cannot be bound is logged and the service goes on without metrics: deciding matters
    more than being watched, and Prometheus shows the target down.
    """
    if port is None:
        yield None
        return
    server = MetricsServer(registry, host=host, port=port, readiness=readiness)
    try:
        await server.start()
    except OSError as error:
        log.error("metrics not served on %s:%s: %s", host, port, error)
        yield None
        return
    log.info("metrics served", extra={"url": f"http://{host}:{server.port}/metrics"})
    try:
        yield server.port
    finally:
        await server.stop()
