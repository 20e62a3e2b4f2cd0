"""The analytics stream: a faust-streaming app over allocations.log, jobs.events and nodes.inventory.

- ``jobs`` (agent over allocations.log + jobs.events, co-partitioned by job id) folds each job
  (:func:`figures.fold_job`) into the ``jobs`` table and adds the measures it completed to windowed
  tables: ``gpu_seconds_hourly`` and ``gpu_seconds_daily`` (tumbling 1 h / 1 d), ``waits`` (hopping: a
  day wide, an hour apart; a histogram per window), ``preemptions_daily`` and ``finals_daily``
  (tumbling 1 d). Windows follow the events' own times (the measure's ``at``), not the clock, so
  replay and restart put every figure in the same window.
- Each window is kept per input partition (key ``queue|gpu_model|partition``) and summed when read.
  Faust writes a table's changelog to the partition of the event being processed and commits it in
  that partition's transaction; a key written from one partition only is restored exactly, and no
  repartition topic is needed (faust would put a repartitioned send in the *destination* partition's
  transaction, which commits only when that partition is consumed: the sums would never be read).
- ``inventory`` (agent over nodes.inventory) keeps each node's GPU model and count: the capacity
  utilisation is measured against (the capacity registered now, not as it was then).

Faust runs with ``processing_guarantee="exactly_once"``: each partition's table changelogs and
consumer offsets commit in one Kafka transaction (the producer flushed first:
:class:`_FlushingTransactions`), so a crash at any instant leaves the tables as the committed
input offsets imply; a restarted app reads its tables back from the changelogs (memory store) and
goes on from those offsets (its inputs resumed only once seeked there:
:mod:`services.analytics.recovery`). Records that do not decode are skipped and counted: this principal
reads only (the services that own those topics dead-letter what they cannot read). One worker
holds every partition (the figures are summed over the partitions it holds).

Served on ``analytics_port``: ``/analytics/gpu-hours?window=hour|day``, ``/analytics/waits``,
``/analytics/preemptions``, ``/analytics/jobs``, ``/analytics/running``, ``/analytics/capacity``
(JSON, for the dashboard) and ``/metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import faust
from faust.transport.consumer import TransactionManager
from faust.types import TP, EventT, StreamT
from faust.web import Request, Response, View
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gangline.bus.admin import TopicSpec, ensure_topics
from gangline.events import topics as catalogue
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode
from gangline.events.nodes import NodeRegistered
from gangline.telemetry import metrics
from services.analytics import figures
from services.analytics.recovery import SeekFirstTableManager
from services.analytics.settings import AnalyticsSettings

log = logging.getLogger(__name__)

SERVICE = "analytics"
WINDOWS_S = {"hour": figures.HOUR_S, "day": figures.DAY_S}


def broker_credentials(settings: AnalyticsSettings) -> faust.auth.Credentials | None:
    """The faust form of the service's Kafka credentials (the same settings every service reads)."""
    security = settings.kafka_security
    if security.sasl:
        return faust.SASLCredentials(
            username=security.username,
            password=security.secret(),
            mechanism=security.sasl_mechanism,
            ssl_context=security.ssl_context() if security.tls else None,
        )
    if security.tls:
        return faust.SSLCredentials(security.ssl_context())
    return None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


class Analytics:
    """The faust app and its tables, for one deployment (topic prefix, group prefix)."""

    def __init__(self, settings: AnalyticsSettings, *, data_dir: Path) -> None:
        self.settings = settings
        self.undecodable = 0
        self._at = 0.0
        self.steps = asyncio.Lock()
        self.unsent: list[asyncio.Future[Any]] = []
        app = faust.App(
            settings.app_id,
            broker=[f"kafka://{b.strip()}" for b in settings.kafka_bootstrap.split(",")],
            broker_credentials=broker_credentials(settings),
            processing_guarantee="exactly_once",
            store="memory://",
            datadir=str(data_dir),
            autodiscover=False,
            topic_replication_factor=settings.replication_factor,
            topic_partitions=1,
            topic_disable_leader=True,
            consumer_auto_offset_reset="earliest",
            broker_commit_interval=settings.commit_interval_s,
            broker_session_timeout=settings.session_timeout_ms / 1000,
            # A restarted worker (same instance id) takes its partitions back without a second member
            # to rebalance around; one worker holds them all, so no standby copies either.
            consumer_group_instance_id=settings.instance_id if settings.static_membership else None,
            table_standby_replicas=0,
            broker_heartbeat_interval=max(0.3, settings.session_timeout_ms / 5000),
            stream_recovery_delay=0.1,
            web_enabled=True,
            web_bind=settings.analytics_host,
            web_host=settings.analytics_host,
            web_port=settings.analytics_port,
            web_stats_enabled=False,
            web_tables_enabled=False,
            web_graph_enabled=False,
            web_metrics_enabled=False,
            key_serializer="raw",
            value_serializer="json",
            Table=_tracked_table(self.unsent),
            TableManager=SeekFirstTableManager,
        )
        # faust commits a transaction without flushing its producer buffer, where table changelog records
        # wait to be sent: they would land in the next transaction, after the offsets that imply them.
        app.transport.TransactionManager = _transactions(self.steps)  # type: ignore[misc]
        self.app = app
        prefix = settings.topic_prefix
        self.job_topics = app.topic(
            prefix + catalogue.ALLOCATIONS_LOG, prefix + catalogue.JOBS_EVENTS, value_serializer="raw"
        )
        self.inventory_topic = app.topic(prefix + catalogue.NODES_INVENTORY, value_serializer="raw")
        self.jobs = app.Table("jobs", default=dict, partitions=catalogue.JOB_PARTITIONS)
        self.nodes = app.Table("nodes", default=list, partitions=1)
        hourly = timedelta(days=settings.hourly_retention_days)
        daily = timedelta(days=settings.daily_retention_days)
        parts = catalogue.JOB_PARTITIONS

        def windowed(
            name: str, default: Callable[[], Any], size: float, expires: timedelta, *, step: float = 0
        ) -> Any:
            table: Any = app.Table(name, default=default, partitions=parts)
            wrapper = (
                table.hopping(size, step, expires=expires) if step else table.tumbling(size, expires=expires)
            )
            return wrapper.relative_to(self._measure_time)

        self.gpu_seconds = {
            "hour": windowed("gpu_seconds_hourly", float, figures.HOUR_S, hourly),
            "day": windowed("gpu_seconds_daily", float, figures.DAY_S, daily),
        }
        self.waits = windowed("waits", list, figures.DAY_S, hourly, step=figures.HOUR_S)
        self.preemptions = windowed("preemptions_daily", list, figures.DAY_S, daily)
        self.finals = windowed("finals_daily", dict, figures.DAY_S, daily)
        app.agent(self.job_topics, name="jobs")(self._fold_jobs)
        app.agent(self.inventory_topic, name="inventory")(self._fold_inventory)
        self._pages()

    def own_topics(self) -> list[TopicSpec]:
        """The changelog topics of the app's tables (compacted; faust deletes expired windows' keys).

        Created before the worker starts (:func:`prepare`): faust verifies a table's changelog against its
        source topic by the consumer's metadata snapshot, which misses a changelog created by the same
        start and fails the first write to that table (PartitionsMismatch: "0 partitions").
        """
        return [
            TopicSpec(
                name=table.changelog_topic.get_topic_name(),
                key="table",
                partitions=table.partitions or 1,
                cleanup_policy="compact",
            )
            for table in self.app.tables.values()
        ]

    async def prepare(self) -> None:
        """Create the app's own topics that do not exist yet (as this principal; it may create them)."""
        await ensure_topics(
            self.settings.kafka_bootstrap,
            self.own_topics(),
            replication_factor=self.settings.replication_factor,
            security=self.settings.kafka_security,
        )

    def _measure_time(self, event: EventT[Any] | None = None) -> float:
        # The windows' time is the measure being added (one event may add to several hours).
        return self._at

    def _decoded(self, raw: Any) -> Envelope | None:
        try:
            return decode(raw if isinstance(raw, bytes) else b"")
        except DecodeError as exc:
            self.undecodable += 1
            log.warning("skipped an undecodable record: %s", exc)
            return None

    # -- agents -------------------------------------------------------------------------------------

    async def _fold_jobs(self, stream: StreamT[Any]) -> None:
        async for event in stream.events():
            envelope = self._decoded(event.value)
            if envelope is None:
                continue
            job_id = envelope.subject
            async with self.steps:  # one event's table writes, whole, between two commits
                stored = self.jobs.get(job_id)
                facts, measures = figures.fold_job(
                    job_id, figures.JobFacts.from_json(stored) if stored else None, envelope
                )
                self.jobs[job_id] = facts.to_json()
                for measure in measures:
                    self._add(measure, event.message.partition)
                await self._delivered()

    async def _delivered(self) -> None:
        """Wait until the broker has every changelog record of this step (in the open transaction)."""
        sent, self.unsent[:] = list(self.unsent), []
        if sent:
            await asyncio.gather(*sent)

    def _add(self, measure: figures.Measure, partition: int) -> None:
        key = f"{measure.key}|{partition}"
        self._at = measure.at
        if measure.kind == "gpu_seconds":
            for table in self.gpu_seconds.values():
                table[key].apply(operator.add, measure.value)
        elif measure.kind == "wait":
            self.waits[key].apply(figures.add_to_histogram, measure.value)
        elif measure.kind == "preemption":
            self.preemptions[key].apply(figures.add_preemption, measure.value)
        elif measure.kind == "final" and measure.state is not None:
            self.finals[key].apply(figures.add_final, measure.state)

    async def _fold_inventory(self, stream: StreamT[Any]) -> None:
        async for raw in stream:
            envelope = self._decoded(raw)
            if envelope is not None and isinstance(envelope.data, NodeRegistered):
                counts: dict[str, int] = {}
                for gpu in envelope.data.gpus:
                    counts[gpu.model] = counts.get(gpu.model, 0) + 1
                async with self.steps:
                    self.nodes[envelope.data.node] = sorted(counts.items())
                    await self._delivered()

    # -- reading the tables -------------------------------------------------------------------------

    def capacity(self) -> dict[str, int]:
        """Registered GPUs per model (``any``: all of them)."""
        out: dict[str, int] = {}
        for counts in self.nodes.values():
            for model, n in counts:
                out[model] = out.get(model, 0) + int(n)
        out[figures.ANY_MODEL] = sum(out.values())
        return out

    @staticmethod
    def _windows(table: Any, add: Callable[[Any, Any], Any]) -> Iterator[tuple[str, str, float, Any]]:
        """(queue, gpu model, window start, value) of every window a windowed table holds, the
        partitions' parts summed with ``add``."""
        summed: dict[tuple[str, str, float], Any] = {}
        for stored_key, value in list(table.table.data.items()):
            key, (start, _end) = stored_key
            series, _, _partition = key.rpartition("|")
            queue, model = figures.split_series_key(series)
            at = (queue, model, float(start))
            summed[at] = add(summed[at], value) if at in summed else value
        for (queue, model, start), value in sorted(summed.items()):
            yield queue, model, start, value

    def gpu_hours(self, window: str) -> list[dict[str, Any]]:
        size = WINDOWS_S[window]
        capacity = self.capacity()
        rows = []
        for queue, model, start, seconds in self._windows(self.gpu_seconds[window], operator.add):
            gpus = capacity.get(model, 0)
            rows.append(
                {
                    "queue": queue,
                    "gpu_model": model,
                    "start": _iso(start),
                    "end": _iso(start + size),
                    "gpu_hours": round(seconds / 3600, 6),
                    "utilisation": round(seconds / (gpus * size), 6) if gpus else None,
                }
            )
        return sorted(rows, key=lambda r: (r["start"], r["queue"], r["gpu_model"]))

    def waits_view(self) -> list[dict[str, Any]]:
        rows = []
        for queue, model, start, counts in self._windows(self.waits, figures.add_histograms):
            rows.append(
                {
                    "queue": queue,
                    "gpu_model": model,
                    "start": _iso(start),
                    "end": _iso(start + figures.DAY_S),
                    "count": sum(counts),
                    **{f"{k}_s": v for k, v in figures.percentiles(counts).items()},
                    "buckets_le_s": [b if b != float("inf") else "+Inf" for b in figures.WAIT_BUCKETS_S],
                    "counts": list(counts),
                }
            )
        return sorted(rows, key=lambda r: (r["start"], r["queue"], r["gpu_model"]))

    def preemptions_view(self) -> list[dict[str, Any]]:
        rows = [
            {
                "queue": queue,
                "gpu_model": model,
                "start": _iso(start),
                "end": _iso(start + figures.DAY_S),
                "preemptions": int(value[0]),
                "gpu_hours_lost": round(value[1] / 3600, 6),
            }
            for queue, model, start, value in self._windows(self.preemptions, figures.add_pairs)
        ]
        return sorted(rows, key=lambda r: (r["start"], r["queue"], r["gpu_model"]))

    def finals_view(self) -> list[dict[str, Any]]:
        rows = [
            {
                "queue": queue,
                "gpu_model": model,
                "start": _iso(start),
                "end": _iso(start + figures.DAY_S),
                "jobs": dict(sorted(value.items())),
            }
            for queue, model, start, value in self._windows(self.finals, figures.add_counts)
        ]
        return sorted(rows, key=lambda r: (r["start"], r["queue"], r["gpu_model"]))

    def running_view(self) -> list[dict[str, Any]]:
        """GPUs held now, per queue and model (the figures above count an allocation once it ends)."""
        held: dict[tuple[str, str], float] = {}
        for stored in self.jobs.values():
            facts = figures.JobFacts.from_json(stored)
            for grant in facts.live:
                if grant.granted_at >= 0 and facts.queue is not None:
                    k = (facts.queue, facts.model_of(grant))
                    held[k] = held.get(k, 0.0) + grant.gpus
        return [{"queue": q, "gpu_model": m, "gpus": g} for (q, m), g in sorted(held.items())]

    # -- HTTP ---------------------------------------------------------------------------------------

    def _pages(self) -> None:
        analytics = self
        views: dict[str, Callable[[Request], Any]] = {
            "/analytics/gpu-hours": lambda request: analytics.gpu_hours(
                request.query.get("window", "hour") if request.query.get("window") in WINDOWS_S else "hour"
            ),
            "/analytics/waits": lambda request: analytics.waits_view(),
            "/analytics/preemptions": lambda request: analytics.preemptions_view(),
            "/analytics/jobs": lambda request: analytics.finals_view(),
            "/analytics/running": lambda request: analytics.running_view(),
            "/analytics/capacity": lambda request: analytics.capacity(),
        }
        for path, figure in views.items():

            class Figure(View):
                async def get(self, request: Request, figure: Callable[[Request], Any] = figure) -> Response:
                    return self.json(figure(request))

            self.app.page(path)(Figure)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))

        class Metrics(View):
            async def get(self, request: Request) -> Response:
                return self.bytes(generate_latest(registry), content_type="text/plain; version=0.0.4")

        self.app.page("/metrics")(Metrics)


class _FlushingTransactions(TransactionManager):
    """faust's transaction manager, committing only between two events' table writes.

    faust sends table changelog records from a buffer, in the background, and commits a transaction
    without waiting for them: records of events whose offsets the commit includes could land in the
    next transaction, and a crash would lose them with their offsets committed. Here each agent step
    holds ``steps`` from its first table write until the broker has all of its records (the table
    class counts them: :func:`_tracked_table`), and a commit takes ``steps`` too: a transaction holds
    whole events, every one up to the offsets it commits (and perhaps the one being acknowledged, whose
    re-reading after a crash changes nothing: the fold remembers what it emitted).

    A commit that ends the transactions (``start_new_transaction=False``: faust's ``wait_empty``, on a
    stop or a revocation) is the last until a rebalance begins them again. faust commits once more on
    its way out (the consumer's own stop, after the app's); with transactional inputs the acked offsets
    are not all one run (commit markers), so that commit had offsets left to send into no transaction:
    ``IllegalOperation`` stopped the consumer's stop before its thread, and the process never exited.
    Those offsets are left uncommitted: their events' writes are in the ended transactions, and reading
    them again at the next start changes nothing.
    """

    steps: asyncio.Lock
    ended: bool = False
    """Whether the transactions were ended (no commit until a rebalance begins them again)."""

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        async with self.steps:
            if self.ended:
                return False
            await self.producer.flush()
            committed = bool(await super().commit(offsets, start_new_transaction=start_new_transaction))
            self.ended = not start_new_transaction
            return committed

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP]) -> None:
        await super().on_rebalance(assigned, revoked, newly_assigned)
        self.ended = False  # the assigned partitions' transactions have begun


def _transactions(steps: asyncio.Lock) -> type[_FlushingTransactions]:
    return type("Transactions", (_FlushingTransactions,), {"steps": steps})


def _tracked_table(unsent: list[asyncio.Future[Any]]) -> type[faust.Table[Any, Any]]:
    """faust's Table, keeping the future of each changelog record it sends in ``unsent``."""

    class Tracked(faust.Table):  # type: ignore[type-arg]
        def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
            future = super().send_changelog(*args, **kwargs)
            unsent.append(future)
            return future

    return Tracked


class _Collector(Collector):
    """The figures of the current hour and day (by this process's clock) as Prometheus gauges, at scrape."""

    def __init__(self, analytics: Analytics, clock: Callable[[], float] = time.time) -> None:
        self.analytics = analytics
        self.clock = clock

    def collect(self) -> Iterator[Any]:
        a, now = self.analytics, self.clock()
        hours = metrics.gauge("gangline_analytics_gpu_hours")
        util = metrics.gauge("gangline_analytics_utilisation_ratio")
        capacity = a.capacity()
        for window, size in WINDOWS_S.items():
            current = now - now % size
            for queue, model, start, seconds in a._windows(a.gpu_seconds[window], operator.add):
                if start == current:
                    hours.add_metric([queue, model, window], seconds / 3600)
                    if capacity.get(model):
                        util.add_metric([queue, model, window], seconds / (capacity[model] * size))
        yield hours
        yield util
        waits = metrics.gauge("gangline_analytics_wait_seconds")
        latest = now - now % figures.HOUR_S - figures.DAY_S + figures.HOUR_S
        for queue, model, start, counts in a._windows(a.waits, figures.add_histograms):
            if start == latest:
                for name, value in figures.percentiles(counts).items():
                    if value is not None:
                        waits.add_metric([queue, model, str(int(name[1:]) / 100)], value)
        yield waits
        today = now - now % figures.DAY_S
        preempted = metrics.gauge("gangline_analytics_preemptions")
        lost = metrics.gauge("gangline_analytics_gpu_hours_lost")
        for queue, model, start, value in a._windows(a.preemptions, figures.add_pairs):
            if start == today:
                preempted.add_metric([queue, model], value[0])
                lost.add_metric([queue, model], value[1] / 3600)
        yield preempted
        yield lost
        ended = metrics.gauge("gangline_analytics_jobs_ended")
        for queue, model, start, value in a._windows(a.finals, figures.add_counts):
            if start == today:
                for state, n in sorted(value.items()):
                    ended.add_metric([queue, model, state], n)
        yield ended
        running = metrics.gauge("gangline_analytics_running_gpus")
        for row in a.running_view():
            running.add_metric([row["queue"], row["gpu_model"]], row["gpus"])
        yield running
        skipped = metrics.counter("gangline_analytics_undecodable_records_total")
        skipped.add_metric([], a.undecodable)
        yield skipped
