"""The FastAPI application: submit/cancel jobs (published to jobs.requests), read the projections.

Writes go to Kafka only; reads come from the ledger's projections in PostgreSQL, so a job submitted
a moment ago may be unknown to GET for a moment (202 Accepted says so).
"""

import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

import asyncpg
from aiokafka.errors import KafkaError
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import ErrorDetails

from gangline.bus import EventProducer
from gangline.core.queues import QueueName
from gangline.events import topics
from gangline.events.base import Event, make_envelope
from gangline.events.codec import render_errors
from gangline.events.jobs import JobCancelRequested, JobRequested, JobSpec
from gangline.events.types import JobIdField, Sentence
from gangline.store.pool import create_pool
from gangline.telemetry.propagation import extract_context
from gangline.telemetry.tracing import get_tracer
from services.api import queries
from services.api.auth import Authenticator, Principal, load_tokens
from services.api.settings import ApiSettings
from services.common.queues import Queues, load_queues

SOURCE = "gangline/api"
MAX_PAGE = 500


def new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


def new_event_id() -> str:
    return str(uuid.uuid4())


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Resources:
    """What the handlers use; the lifespan opens what the caller did not give."""

    pool: asyncpg.Pool
    producer: EventProducer


class JobSubmission(JobSpec):
    """A job request as the API takes it: the event's fields, the job id optional (the API makes one)."""

    job_id: JobIdField | None = None


class Submitted(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    event_id: str
    queue: str
    status_url: str


class CancelRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Sentence | None = None


class Page(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last page")


def why(job: dict[str, Any]) -> dict[str, Any]:
    """The structured answer to "why is my job not running?" from its projection row."""
    state = job["state"]
    reasons = job.get("pending_reasons") or []
    if state == "pending":
        summary = job["reason"] or "no reason reported yet"
    elif state == "requested":
        summary = "waiting for admission"
    elif state in ("admitted", "queued", "requeued"):
        summary = f"waiting in queue {job['queue']!r} for the next scheduling cycle"
        reasons = []
    elif state in ("rejected", "failed", "cancelled", "preempting"):
        summary = f"{state}: {job['reason']}" if job.get("reason") else state
        reasons = []
    else:
        summary = f"not pending ({state})"
        reasons = []
    return {"state": state, "pending": state == "pending", "summary": summary, "reasons": reasons}


def create_app(
    settings: ApiSettings,
    *,
    resources: Resources | None = None,
    queues: Queues | None = None,
    authenticator: Authenticator | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    clock: Callable[[], datetime] = utc_now,
    job_ids: Callable[[], str] = new_job_id,
    event_ids: Callable[[], str] = new_event_id,
) -> FastAPI:
    """The app; ``resources`` given by tests, else opened (and closed) by the lifespan; ``queues`` by
    tests, else read from ``settings.queues_file``."""
    configured = queues if queues is not None else load_queues(settings.queues_file)
    quota_tree = configured.tree
    auth = authenticator or Authenticator(load_tokens(file=settings.tokens_file, inline=settings.tokens))
    tracer = get_tracer(tracer_provider)
    requests_topic = settings.topic_prefix + topics.JOBS_REQUESTS
    state: dict[str, Resources] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if resources is not None:
            state["r"] = resources
            yield
            return
        pool = await create_pool(settings.pg_dsn.get_secret_value())
        producer = EventProducer(settings.kafka_bootstrap, client_id="gangline-api")
        try:
            await producer.start()
            state["r"] = Resources(pool, producer)
            yield
        finally:
            await producer.stop()
            await pool.close()

    app = FastAPI(
        title="Gangline",
        version="1",
        summary="GPU scheduler for shared AI clusters: jobs, queues, nodes and the allocation log.",
        lifespan=lifespan,
    )
    bearer = HTTPBearer(auto_error=False)

    def res() -> Resources:
        if "r" not in state:
            if resources is None:
                raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "starting")
            state["r"] = resources
        return state["r"]

    def principal(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        found = auth.principal(credentials.credentials) if credentials is not None else None
        if found is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return found

    Caller = Annotated[Principal, Depends(principal)]

    def require(caller: Principal, queue: str) -> None:
        if not caller.may_act_on(queue):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"tenant {caller.tenant!r} may not act on queue {queue!r}"
            )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        errors = list(error.errors())
        located = [{**e, "loc": tuple(p for p in e["loc"] if p not in ("body",))} for e in errors]
        problems = render_errors(cast(list[ErrorDetails], located), prefix="")
        detail = [
            {"field": ".".join(str(p) for p in e["loc"]) or "body", "message": m, "type": e["type"]}
            for e, m in zip(located, problems, strict=True)
        ]
        return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    async def publish(request: Request, name: str, data: Event) -> str:
        event_id = event_ids()
        headers = [(k, v.encode()) for k, v in request.headers.items() if k in ("traceparent", "tracestate")]
        with tracer.start_as_current_span(name, context=extract_context(headers), kind=SpanKind.SERVER):
            envelope = make_envelope(data, event_id=event_id, source=SOURCE, time=clock())
            try:
                await res().producer.publish(requests_topic, envelope)
            except KafkaError as error:
                raise HTTPException(
                    status.HTTP_503_SERVICE_UNAVAILABLE, f"the event log did not take the request: {error}"
                ) from error
        return event_id

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """200 when the database answers and the producer is up; 503 otherwise."""
        r = res()
        try:
            await r.pool.fetchval("SELECT 1")
            r.producer.raw  # noqa: B018 - raises when the producer is not started
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RuntimeError) as error:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"not ready: {error}") from error
        return {"status": "ok"}

    @app.post("/v1/jobs", status_code=status.HTTP_202_ACCEPTED, tags=["jobs"])
    async def submit(submission: JobSubmission, request: Request, caller: Caller) -> Submitted:
        """Ask for a job: published as job.requested on jobs.requests; admission answers on jobs.events."""
        require(caller, submission.queue)
        job_id = submission.job_id or job_ids()
        async with res().pool.acquire() as conn:
            if await queries.job(conn, job_id) or await queries.requested_queue(conn, job_id):
                raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id!r} already exists")
        fields = submission.model_dump(exclude={"job_id", "submitted_by"}, exclude_unset=True)
        request_event = JobRequested.model_validate(
            {**fields, "job_id": job_id, "submitted_by": caller.tenant}
        )
        event_id = await publish(request, "POST /v1/jobs", request_event)
        return Submitted(
            job_id=job_id, event_id=event_id, queue=submission.queue, status_url=f"/v1/jobs/{job_id}"
        )

    async def readable_job(
        conn: asyncpg.Connection, job_id: str, caller: Principal
    ) -> tuple[dict[str, Any] | None, str]:
        row = await queries.job(conn, job_id)
        queue = row["queue"] if row is not None else await queries.requested_queue(conn, job_id)
        if queue is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
        require(caller, queue)
        return row, queue

    @app.post("/v1/jobs/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, tags=["jobs"])
    async def cancel(
        job_id: str, request: Request, caller: Caller, body: CancelRequest | None = None
    ) -> dict[str, str]:
        """Ask to stop a job, queued or running: published as job.cancel_requested."""
        async with res().pool.acquire() as conn:
            await readable_job(conn, job_id, caller)
        event = JobCancelRequested(
            job_id=job_id, reason=body.reason if body else None, requested_by=caller.tenant
        )
        event_id = await publish(request, "POST /v1/jobs/{job_id}/cancel", event)
        return {"job_id": job_id, "event_id": event_id}

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    async def get_job(job_id: str, caller: Caller) -> dict[str, Any]:
        """The job, its events in order, its allocations, and why it is (not) pending."""
        async with res().pool.acquire() as conn:
            row, queue = await readable_job(conn, job_id, caller)
            events = await queries.job_events(conn, job_id)
            allocs, _ = await queries.allocations(
                conn, queues=None, job_id=job_id, node=None, held=None, limit=MAX_PAGE, after=None
            )
        job = (
            row
            if row is not None
            else {"job_id": job_id, "queue": queue, "state": "requested", "reason": None}
        )
        return {"job": job, "why": why(job), "events": events, "allocations": allocs}

    @app.get("/v1/jobs", tags=["jobs"])
    async def list_jobs(
        caller: Caller,
        queue: str | None = None,
        state: str | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        cursor: str | None = None,
    ) -> Page:
        """Jobs, newest first; filter by queue and state; page with ``cursor``."""
        visible = caller.visible_queues()
        if queue is not None:
            require(caller, queue)
            visible = [queue]
        after = _cursor(cursor, (datetime, str))
        async with res().pool.acquire() as conn:
            items, next_cursor = await queries.jobs(
                conn, queues=visible, state=state, limit=limit, after=(after[0], after[1]) if after else None
            )
        return Page(items=items, next_cursor=next_cursor)

    @app.get("/v1/allocations", tags=["allocations"])
    async def list_allocations(
        caller: Caller,
        job_id: str | None = None,
        node: str | None = None,
        held: bool | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: str | None = None,
    ) -> Page:
        """The allocation log in grant order, one row per rank; ``held=true`` for what is held now."""
        after = _cursor(cursor, (datetime, str, int))
        async with res().pool.acquire() as conn:
            items, next_cursor = await queries.allocations(
                conn,
                queues=caller.visible_queues(),
                job_id=job_id,
                node=node,
                held=held,
                limit=limit,
                after=(after[0], after[1], after[2]) if after else None,
            )
        return Page(items=items, next_cursor=next_cursor)

    @app.get("/v1/nodes", tags=["nodes"])
    async def list_nodes(caller: Caller) -> dict[str, Any]:
        """Every node: state, GPUs, topology, health, cordoned GPUs, last heartbeat, GPUs held."""
        async with res().pool.acquire() as conn:
            return {"items": await queries.nodes(conn)}

    @app.get("/v1/queues", tags=["queues"], response_model=QueueList)
    async def list_queues(caller: Caller) -> dict[str, Any]:
        """Per queue: quota (from the queues file), usage now, jobs per state, and the quota service's
        fair-share figures.

        ``usage`` (GPUs held by running allocations) and ``jobs`` (jobs per state) are facts the ledger
        holds. The fair-share figures are quota's own, from its latest ``queue.status`` (topic
        queues.status), the figure quota orders waiting work by: ``dominant_share`` (DRF across GPU
        models over usage decayed with GANGLINE_FAIR_SHARE_HALF_LIFE_S, divided by the weight) with its
        ``dominant_resource``, the queue's fair-share ``position`` among the ``of`` queues of its quota
        tree (1 = lowest share, served first at equal priority), and per resource what quota has
        charged (``charged``: queued and running jobs), ``borrowed`` beyond the nominal quota and what
        the cohort could still ``lendable`` it; ``as_of`` is the event time they hold after (quota
        publishes at most every GANGLINE_STATUS_INTERVAL_S of event time, after usage moved).

        ``reported`` says where they come from: "quota"; "not_reported_yet" (a limited queue quota
        has published nothing for: the figures are null); "unlimited" (outside the quota tree, never
        held back, no fair share: null). The API computes no figure of its own. A queue the file no
        longer names but that still has jobs is listed with ``configured`` false.
        """
        async with res().pool.acquire() as conn:
            node_rows = await queries.nodes(conn)
            usage, counts = await queries.queue_usage(conn, queries.gpu_models(node_rows))
            reported = await queries.queue_statuses(conn)
        names = sorted(set(configured.names()) | set(usage) | set(counts))
        visible = caller.visible_queues()
        if visible is not None:
            names = [n for n in names if n in visible]
        items = []
        for name in names:
            spec = quota_tree.spec(QueueName(name)) if quota_tree.has_queue(name) else None
            unlimited = name in configured.unlimited
            quota: dict[str, Any] | str = (
                "unlimited"
                if unlimited
                else {
                    r: {
                        "nominal": q.nominal,
                        "borrowing_limit": q.borrowing_limit,
                        "lending_limit": q.lending_limit,
                    }
                    for r, q in (spec.quotas.items() if spec else [])
                }
            )
            status = None if unlimited else reported.get(name)
            items.append(
                {
                    "queue": name,
                    "configured": configured.known(name),
                    "cohort": spec.cohort if spec else None,
                    "weight": configured.weight(QueueName(name)),
                    "quota": quota,
                    "usage": usage.get(name, {}),
                    "jobs": counts.get(name, {}),
                    "reported": "unlimited" if unlimited else "quota" if status else "not_reported_yet",
                    **_quota_figures(status),
                }
            )
        return {"items": items}

    return app


class QueueFigures(BaseModel):
    """Quota's fair-share figures of a queue (null while quota has not reported the queue)."""

    as_of: datetime | None = Field(description="event time quota's figures hold after")
    dominant_share: float | None = Field(description="quota's DRF share over decayed usage, over the weight")
    dominant_resource: str | None
    position: int | None = Field(description="fair-share rank in its quota tree, 1 = lowest share")
    of: int | None = Field(description="how many queues of its quota tree the rank is among")
    charged: dict[str, int] | None = Field(description="per resource: what quota charges the queue now")
    borrowed: dict[str, int] | None = Field(description="per resource: held beyond its nominal quota")
    lendable: dict[str, int] | None = Field(description="per resource: what its cohort could still lend it")


class QueueItem(QueueFigures):
    queue: str
    configured: bool
    cohort: str | None
    weight: float
    quota: dict[str, dict[str, int | None]] | Literal["unlimited"]
    usage: dict[str, int] = Field(description="GPUs (or MIG slices) held by running allocations")
    jobs: dict[str, int] = Field(description="jobs per state")
    reported: Literal["quota", "not_reported_yet", "unlimited"] = Field(
        description="where the fair-share figures come from; null figures unless quota"
    )


class QueueList(BaseModel):
    items: list[QueueItem]


def _quota_figures(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """A ``queue_status`` row as the API reports it; every figure null without one."""
    if status is None:
        return dict.fromkeys(QueueFigures.model_fields)
    resources: Mapping[str, Mapping[str, int]] = status["resources"]
    return {
        "as_of": status["as_of"],
        "dominant_share": status["dominant_share"],
        "dominant_resource": status["dominant_resource"],
        "position": status["position"],
        "of": status["ranked_among"],
        "charged": {r: v["used"] for r, v in resources.items()},
        "borrowed": {r: v["borrowed"] for r, v in resources.items() if v["borrowed"]},
        "lendable": {r: v["lendable"] for r, v in resources.items()},
    }


def _cursor(cursor: str | None, kinds: tuple[type, ...]) -> list[Any] | None:
    if cursor is None:
        return None
    try:
        return queries.decode_cursor(cursor, kinds)
    except queries.BadCursor as error:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(error)) from error


__all__ = ["JobSubmission", "Resources", "create_app", "why"]
