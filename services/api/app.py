"""The FastAPI application: submit/cancel jobs (published to jobs.requests), read the projections.

Writes go to Kafka only; reads come from the ledger's projections in PostgreSQL, so a job submitted
a moment ago may be unknown to the ledger for a moment (202 Accepted says so); this replica remembers
the jobs it accepted recently, so a GET right after a POST shows the job as ``requested``, not 404.

What every request goes through, before any handler: a body-size cap and a NUL-byte check
(:class:`services.api.limits.RequestGuard`), a bearer token (:mod:`services.api.auth`), and a rate
limit per tenant (429 with ``Retry-After``). Request bodies are validated strictly (JSON types as
they are: ``"1"`` is not a number). Every error is a problem document (:mod:`services.api.problems`).
"""

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal, TypeVar, cast

import asyncpg
import httpx
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from fastapi import Depends, FastAPI, Path, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails
from starlette.exceptions import HTTPException as StarletteHTTPException

from gangline.bus import EventProducer
from gangline.core.queues import QueueName, QuotaTree
from gangline.events import topics
from gangline.events.base import MODEL_CONFIG, Event, make_envelope
from gangline.events.codec import render_errors
from gangline.events.jobs import NO_NUL, SLICE_RULE, JobCancelRequested, JobRequested, JobSpec, JobState
from gangline.events.nodes import DEFAULT_DRAIN_GRACE_S, MAX_DRAIN_GRACE_S, NodeCordoned, NodeUncordoned
from gangline.events.queues import QueueStatus
from gangline.events.types import SAFE_ID_PATTERN, JobIdField
from gangline.fold.figures import lent
from gangline.store.pool import create_pool
from gangline.telemetry.propagation import extract_context
from gangline.telemetry.tracing import get_tracer
from services.api import queries
from services.api.auth import Authenticator, Principal, StreamTokens, load_tokens
from services.api.limits import RateLimiter, RequestGuard, retry_after
from services.api.live import LiveFeed, stream
from services.api.metrics import CountRequests, api_metrics
from services.api.problems import ApiProblem, document, problem, problems, render
from services.api.settings import ApiSettings
from services.common.queues import Queues, load_queues
from services.common.topics import TopicNames

SOURCE = "gangline/api"
STATIC = FilePath(__file__).parent / "static"
"""The dashboard: plain HTML, JS and CSS, served at /dashboard/ (no build step)."""
AnalyticsFigure = Literal["gpu-hours", "waits", "preemptions", "jobs", "running", "capacity"]
"""The analytics app's JSON figures the API passes on (services/analytics)."""
MAX_PAGE = 500
RECENT_JOBS = 10_000
"""How many accepted submissions a replica remembers until the ledger has them (read-your-writes, 409)."""

log = logging.getLogger(__name__)

JobIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=SAFE_ID_PATTERN)]
QueueQuery = Annotated[str | None, Query(min_length=1, max_length=63, pattern=SAFE_ID_PATTERN)]
JobIdQuery = Annotated[str | None, Query(min_length=1, max_length=128, pattern=SAFE_ID_PATTERN)]
NodeQuery = Annotated[str | None, Query(min_length=1, max_length=253, pattern=SAFE_ID_PATTERN)]
NodePath = Annotated[str, Path(min_length=1, max_length=253, pattern=SAFE_ID_PATTERN)]
JOBS_CURSOR = (datetime, str)
"""A job list's sort key: submitted at, job id."""
ALLOCATIONS_CURSOR = (datetime, str, int)
"""The allocation log's sort key: granted at, allocation id, rank."""
CURSOR_HELP = (
    "a page's next_cursor; any string of the pattern is a position in the list's order "
    "(microseconds since the epoch, then the ids, joined by ~)"
)
JobsCursorQuery = Annotated[
    str | None,
    Query(pattern=queries.cursor_pattern(JOBS_CURSOR, id_chars=128), description=CURSOR_HELP),
]
AllocationsCursorQuery = Annotated[
    str | None,
    Query(pattern=queries.cursor_pattern(ALLOCATIONS_CURSOR, id_chars=160), description=CURSOR_HELP),
]
Reason = Annotated[str, Field(min_length=1, max_length=2000, pattern=NO_NUL)]


def rfc3339(value: object) -> object:
    """A query's time as RFC 3339 writes it (date first): not a number of seconds, which pydantic would
    otherwise take as a Unix time (``?since=0.5``), though the OpenAPI says ``format: date-time``."""
    if isinstance(value, str) and not RFC3339_DATE.match(value):
        raise ValueError("a time in RFC 3339 (e.g. 2026-01-01T00:00:00Z)")
    return value


RFC3339_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]")
SinceQuery = Annotated[datetime | None, BeforeValidator(rfc3339), Query(description="RFC 3339, with a zone")]

READ = (400, 401, 413, 422, 429, 503)
"""What any authenticated route may answer besides its own success."""
WRITE = (*READ, 415)


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
    feed: LiveFeed | None = None
    """The dashboard's live feed (``GET /v1/stream``); None: the stream answers 503."""


class JobSubmission(JobSpec):
    """A job request as the API takes it: the event's fields, the job id optional (the API makes one).

    Validated strictly: every field has its JSON type (``"workers": "1"`` is refused, not coerced).
    ``submitted_by`` is ignored: the API records the caller's tenant.
    """

    model_config = ConfigDict(**{**MODEL_CONFIG, "strict": True, "json_schema_extra": SLICE_RULE})

    job_id: JobIdField | None = None


class Submitted(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    event_id: str
    queue: str
    status_url: str


class CancelRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    reason: Reason | None = None


class Cancelled(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    event_id: str


class CordonRequest(BaseModel):
    """Why the node is taken out of (or put back into) service, for its history."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    reason: Reason | None = None


class DrainRequest(CordonRequest):
    grace_s: Annotated[int, Field(ge=0, le=MAX_DRAIN_GRACE_S)] = DEFAULT_DRAIN_GRACE_S
    """Seconds running work may still run before it is asked to checkpoint and leave (default 600)."""


class OperatorAction(BaseModel):
    model_config = ConfigDict(frozen=True)

    node: str
    action: Literal["cordon", "drain", "uncordon"]
    event_id: str
    drain_grace_s: int | None = None


class Page(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last page")


class Health(BaseModel):
    status: Literal["ok"]


M = TypeVar("M", bound=BaseModel)


_FLOAT_LITERAL = re.compile(rb"[0-9][.eE]")


def integral_numbers_as_integers(raw: bytes) -> bytes:
    """The body with every integral number written as an integer (``8.0`` as ``8``): JSON Schema's
    ``integer`` is any number with no fraction, so the OpenAPI promises ``"workers": 8.0`` is taken, while
    strict validation takes only ``8`` (and still refuses ``"8"``). Bodies without such a number, and
    bodies that are not JSON (validation says why), are returned as they are."""
    if _FLOAT_LITERAL.search(raw) is None:
        return raw
    rewritten = False

    def number(text: str) -> int | float:
        nonlocal rewritten
        value = float(text)
        if value.is_integer() and abs(value) < 2**63:
            rewritten = True
            return int(value)
        return value

    try:
        doc = json.loads(raw, parse_float=number)
    except (ValueError, RecursionError):
        return raw
    # ASCII escapes: whatever the strings hold (a lone surrogate too) is written back as it was read.
    return json.dumps(doc).encode() if rewritten else raw


def strict_body(model: type[M], *, optional: bool = False) -> Callable[[Request], Any]:
    """A dependency that reads the body (the guard has bounded it) and validates it strictly as JSON."""

    async def parsed(request: Request) -> M | None:
        raw = await request.body()
        if not raw.strip() and optional:
            return None
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
            raise ApiProblem(
                status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                f"the body must be application/json (got {kind!r})",
                kind="not-json",
            )
        try:
            return model.model_validate_json(integral_numbers_as_integers(raw))
        except ValidationError as error:
            errors = [{**e, "loc": ("body", *e["loc"])} for e in error.errors()]
            raise RequestValidationError(errors) from None

    return parsed


def body_schema(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` documenting a body a :func:`strict_body` dependency reads."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


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
    elif state in ("rejected", "failed", "cancelled", "preempting", "resizing"):
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
    monotonic: Callable[[], float] = time.monotonic,
    job_ids: Callable[[], str] = new_job_id,
    event_ids: Callable[[], str] = new_event_id,
) -> FastAPI:
    """The app; ``resources`` given by tests, else opened (and closed) by the lifespan; ``queues`` by
    tests, else read from ``settings.queues_file``; ``monotonic`` is the rate limiter's clock."""
    configured = queues if queues is not None else load_queues(settings.queues_file)
    quota_tree = configured.tree
    auth = authenticator or Authenticator(load_tokens(file=settings.tokens_file, inline=settings.tokens))
    limiter = RateLimiter(rate=settings.rate_limit_per_s, burst=settings.rate_limit_burst, clock=monotonic)
    key = settings.stream_token_key
    stream_tokens = StreamTokens(
        auth, key=key.get_secret_value().encode() if key else None, ttl_s=settings.stream_token_ttl_s
    )
    tracer = get_tracer(tracer_provider)
    requests_topic = settings.topic_prefix + topics.JOBS_REQUESTS
    operator_topic = settings.topic_prefix + topics.NODES_OPERATOR
    layout = settings.pool_layout
    state: dict[str, Resources] = {}
    # Submissions accepted here that the ledger may not have yet: job id -> the request's data.
    recent: OrderedDict[str, dict[str, Any]] = OrderedDict()

    metrics, requests_answered = api_metrics()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if resources is not None:
            state["r"] = resources
            yield
            return
        pool = await create_pool(settings.pg_dsn.get_secret_value())
        producer = EventProducer(settings.kafka_bootstrap, client_id="gangline-api")
        feed = LiveFeed(
            bootstrap=settings.kafka_bootstrap,
            topics=TopicNames(prefix=settings.topic_prefix),
            pool=pool,
            settle_s=settings.live_settle_s,
        )
        feeding: asyncio.Task[None] | None = None
        try:
            await producer.start()
            state["r"] = Resources(pool, producer, feed)
            feeding = asyncio.create_task(feed.run(), name="live-feed")
            async with metrics.serve(settings):
                yield
        finally:
            if feeding is not None:
                feeding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feeding
            await producer.stop()
            await pool.close()

    app = FastAPI(
        title="Gangline",
        version="1",
        summary="GPU scheduler for shared AI clusters: jobs, queues, nodes and the allocation log.",
        lifespan=lifespan,
    )
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(CountRequests, requests=requests_answered)
    bearer = HTTPBearer(auto_error=False)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (JobSubmission, CancelRequest, CordonRequest, DrainRequest):
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(body.pop("$defs", {}))
                schemas[model.__name__] = body
            app.openapi_schema = document(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def res() -> Resources:
        if "r" not in state:
            if resources is None:
                raise ApiProblem(status.HTTP_503_SERVICE_UNAVAILABLE, "starting", kind="unavailable")
            state["r"] = resources
        return state["r"]

    # async although it never awaits: a sync dependency runs in the thread pool, and the hop there and back
    # (a GIL hand-over each way) is most of what a submission costs under load.
    async def principal(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        found = auth.principal(credentials.credentials) if credentials is not None else None
        if found is None:
            raise ApiProblem(
                status.HTTP_401_UNAUTHORIZED,
                "a valid bearer token is required",
                kind="unauthenticated",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return limited(found)

    def limited(found: Principal) -> Principal:
        wait_s = limiter.take(found.tenant)
        if wait_s is not None:
            raise ApiProblem(
                status.HTTP_429_TOO_MANY_REQUESTS,
                f"tenant {found.tenant!r} is over its rate limit of {limiter.rate:g} requests per second "
                f"(burst {limiter.burst}); retry in {wait_s:.1f} s",
                kind="rate-limited",
                headers={"Retry-After": retry_after(wait_s)},
            )
        return found

    Caller = Annotated[Principal, Depends(principal)]

    def require(caller: Principal, queue: str) -> None:
        if not caller.may_act_on(queue):
            raise ApiProblem(
                status.HTTP_403_FORBIDDEN,
                f"tenant {caller.tenant!r} may not act on queue {queue!r}",
                kind="forbidden",
            )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        errors = list(error.errors())
        located = [{**e, "loc": tuple(p for p in e["loc"] if p not in ("body",))} for e in errors]
        problems_ = [
            render_errors([cast(ErrorDetails, e)], prefix="" if e["loc"] else "body")[0] for e in located
        ]
        detail = [
            {"field": ".".join(str(p) for p in e["loc"]) or "body", "message": m, "type": e["type"]}
            for e, m in zip(located, problems_, strict=True)
        ]
        return problem(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            "; ".join(problems_) or "the request does not validate",
            kind="invalid",
            title="Invalid request",
            errors=detail,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            # Starlette names the methods of the first route on the path; Allow lists every route's.
            error.headers = {**(error.headers or {}), "Allow": ", ".join(allowed(request.url.path))}
        return render(error)

    def allowed(path: str) -> list[str]:
        methods: set[str] = set()
        for route in app.routes:
            if isinstance(route, APIRoute) and route.path_regex.match(path):
                methods |= route.methods or set()
        return sorted(methods | ({"HEAD"} if "GET" in methods else set()))

    @app.exception_handler(asyncpg.PostgresError)
    @app.exception_handler(asyncpg.InterfaceError)
    @app.exception_handler(OSError)
    async def database_down(_: Request, error: Exception) -> JSONResponse:
        log.warning("database error: %s", type(error).__name__)
        return problem(503, "the database is not available now", kind="unavailable")

    @app.exception_handler(Exception)
    async def crashed(_: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error")  # a bug: the body says nothing of it
        return problem(500, "the API failed on this request; it is logged", kind="internal")

    async def publish(
        request: Request, name: str, data: Event, *, topic: str | None = None, partition: int | None = None
    ) -> str:
        event_id = event_ids()
        headers = [(k, v.encode()) for k, v in request.headers.items() if k in ("traceparent", "tracestate")]
        with tracer.start_as_current_span(name, context=extract_context(headers), kind=SpanKind.SERVER):
            envelope = make_envelope(data, event_id=event_id, source=SOURCE, time=clock())
            try:
                await res().producer.publish(topic or requests_topic, envelope, partition=partition)
            except MessageSizeTooLargeError as error:
                raise ApiProblem(
                    status.HTTP_413_CONTENT_TOO_LARGE,
                    f"the event this request makes is over the event log's size limit: {error}",
                    kind="event-too-large",
                ) from error
            except KafkaError as error:
                raise ApiProblem(
                    status.HTTP_503_SERVICE_UNAVAILABLE,
                    f"the event log did not take the request: {error}",
                    kind="unavailable",
                ) from error
        return event_id

    @app.get("/healthz", tags=["ops"], responses=problems(400, 413, 503))
    async def healthz() -> Health:
        """200 when the database answers and the producer is up; 503 otherwise."""
        r = res()
        try:
            await r.pool.fetchval("SELECT 1")
            r.producer.raw  # noqa: B018 - raises when the producer is not started
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RuntimeError) as error:
            raise ApiProblem(
                status.HTTP_503_SERVICE_UNAVAILABLE, f"not ready: {error}", kind="unavailable"
            ) from error
        return Health(status="ok")

    @app.post(
        "/v1/jobs",
        status_code=status.HTTP_202_ACCEPTED,
        tags=["jobs"],
        responses=problems(*WRITE, 403, 409),
        openapi_extra=body_schema(JobSubmission),
    )
    async def submit(
        caller: Caller,  # first: who calls is settled (401, 429) before the body is read
        submission: Annotated[JobSubmission, Depends(strict_body(JobSubmission))],
        request: Request,
    ) -> Submitted:
        """Ask for a job: published as job.requested on jobs.requests; admission answers on jobs.events.

        The job records the caller's tenant (``submitted_by``): in ``default``, the queue every tenant
        may use, only that tenant (and admins) may see or cancel it."""
        require(caller, submission.queue)
        job_id = submission.job_id or job_ids()
        if job_id in recent or await queries.job_known(res().pool, job_id):
            raise ApiProblem(status.HTTP_409_CONFLICT, f"job {job_id!r} already exists", kind="conflict")
        fields = submission.model_dump(exclude={"job_id", "submitted_by"}, exclude_unset=True)
        request_event = JobRequested.model_validate(
            {**fields, "job_id": job_id, "submitted_by": caller.tenant}
        )
        recent[job_id] = request_event.model_dump(mode="json")  # held while publishing: a 2nd POST is 409
        try:
            event_id = await publish(request, "POST /v1/jobs", request_event)
        except BaseException:
            recent.pop(job_id, None)
            raise
        while len(recent) > RECENT_JOBS:
            recent.popitem(last=False)
        return Submitted(
            job_id=job_id, event_id=event_id, queue=submission.queue, status_url=f"/v1/jobs/{job_id}"
        )

    async def readable_job(conn: asyncpg.Connection, job_id: str, caller: Principal) -> dict[str, Any]:
        """The job's row (shaped from its request while only that is known); 404 unless the caller may
        see it (a job another tenant submitted to ``default`` is not there for this one)."""
        row = await queries.job(conn, job_id)
        if row is None:
            asked = await queries.requested(conn, job_id) or recent.get(job_id)
            if asked is None:
                raise ApiProblem(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}", kind="not-found")
            row = queries.requested_job(asked)
        queue, owner = row["queue"], row.get("submitted_by")
        if not caller.may_see(queue, owner):
            if caller.may_act_on(queue):  # default: another tenant's job, not to be confirmed to exist
                raise ApiProblem(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}", kind="not-found")
            require(caller, queue)
        return row

    @app.post(
        "/v1/jobs/{job_id}/cancel",
        status_code=status.HTTP_202_ACCEPTED,
        tags=["jobs"],
        responses=problems(*WRITE, 403, 404),
        openapi_extra=body_schema(CancelRequest, required=False),
    )
    async def cancel(
        caller: Caller,
        job_id: JobIdPath,
        request: Request,
        body: Annotated[CancelRequest | None, Depends(strict_body(CancelRequest, optional=True))],
    ) -> Cancelled:
        """Ask to stop a job, queued or running: published as job.cancel_requested."""
        async with res().pool.acquire() as conn:
            await readable_job(conn, job_id, caller)
        event = JobCancelRequested(
            job_id=job_id, reason=body.reason if body else None, requested_by=caller.tenant
        )
        event_id = await publish(request, "POST /v1/jobs/{job_id}/cancel", event)
        return Cancelled(job_id=job_id, event_id=event_id)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], responses=problems(*READ, 403, 404))
    async def get_job(caller: Caller, job_id: JobIdPath) -> dict[str, Any]:
        """The job, its events in order, its allocations, its size history (an elastic job's resizes:
        one entry per allocation, ``workers_now`` the live one's), and why it is (not) pending."""
        async with res().pool.acquire() as conn:
            job = await readable_job(conn, job_id, caller)
            events = await queries.job_events(conn, job_id)
            allocs, _ = await queries.allocations(
                conn, seen=None, job_id=job_id, node=None, held=None, limit=MAX_PAGE, after=None
            )
        sizes = queries.size_history(allocs)
        job["workers_now"] = next((s["workers"] for s in sizes if s["released_at"] is None), None)
        return {"job": job, "why": why(job), "events": events, "allocations": allocs, "sizes": sizes}

    def seen_by(caller: Principal) -> queries.Visible | None:
        own = caller.own_queues()
        return None if own is None else queries.Visible(queues=own, owner=caller.tenant)

    @app.get("/v1/jobs", tags=["jobs"], responses=problems(*READ, 403))
    async def list_jobs(
        caller: Caller,
        queue: QueueQuery = None,
        state: JobState | None = None,
        active: bool | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        cursor: JobsCursorQuery = None,
    ) -> Page:
        """Jobs, newest first; filter by queue and state, or ``active`` (true: not over yet, as squeue
        lists; false: completed, failed, cancelled or rejected); page with ``cursor``. A tenant sees the
        jobs of its queues and, in ``default``, the jobs it submitted."""
        if queue is not None:
            require(caller, queue)
        after = _cursor(cursor, JOBS_CURSOR)
        async with res().pool.acquire() as conn:
            items, next_cursor = await queries.jobs(
                conn,
                seen=seen_by(caller),
                queue=queue,
                state=state,
                limit=limit,
                after=(after[0], after[1]) if after else None,
                active=active,
            )
        return Page(items=items, next_cursor=next_cursor)

    @app.get("/v1/allocations", tags=["allocations"], responses=problems(*READ))
    async def list_allocations(
        caller: Caller,
        job_id: JobIdQuery = None,
        node: NodeQuery = None,
        held: bool | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: AllocationsCursorQuery = None,
    ) -> Page:
        """The allocation log in grant order, one row per rank; ``held=true`` for what is held now.
        A tenant sees the allocations of the jobs it may see."""
        after = _cursor(cursor, ALLOCATIONS_CURSOR)
        async with res().pool.acquire() as conn:
            items, next_cursor = await queries.allocations(
                conn,
                seen=seen_by(caller),
                job_id=job_id,
                node=node,
                held=held,
                limit=limit,
                after=(after[0], after[1], after[2]) if after else None,
            )
        return Page(items=items, next_cursor=next_cursor)

    @app.get("/v1/nodes", tags=["nodes"], responses=problems(*READ))
    async def list_nodes(caller: Caller) -> dict[str, Any]:
        """Every node: state, GPUs, topology, health, cordoned GPUs, last heartbeat, GPUs held, and the
        operator's ``cordon`` (mode cordon or drain, reason, since, drain grace) where one stands."""
        async with res().pool.acquire() as conn:
            items = await queries.nodes(conn)
            cordons = await queries.cordons(conn)
        return {"items": [{**n, "cordon": cordons.get(n["node"])} for n in items]}

    async def operate(
        caller: Principal,
        request: Request,
        node: str,
        event: NodeCordoned | NodeUncordoned,
        action: Literal["cordon", "drain", "uncordon"],
    ) -> OperatorAction:
        if not caller.admin:
            raise ApiProblem(
                status.HTTP_403_FORBIDDEN,
                f"tenant {caller.tenant!r} may not {action} nodes: only an admin token may",
                kind="forbidden",
            )
        async with res().pool.acquire() as conn:
            if not await queries.node_known(conn, node):
                raise ApiProblem(status.HTTP_404_NOT_FOUND, f"no node {node!r}", kind="not-found")
            # With pools the word goes to the node's pool's partition, where that pool's owners read it.
            pool = layout.pool_of(await queries.node_pool_labels(conn, node)) if layout is not None else None
        partition = layout.partition(pool) if layout is not None and pool is not None else None
        event_id = await publish(
            request, f"POST /v1/nodes/{{node}}/{action}", event, topic=operator_topic, partition=partition
        )
        grace = event.drain_grace_s if isinstance(event, NodeCordoned) else None
        return OperatorAction(node=node, action=action, event_id=event_id, drain_grace_s=grace)

    def node_action(
        action: Literal["cordon", "drain", "uncordon"],
        body_type: type[CordonRequest],
        event_of: Callable[[str, str, Any], NodeCordoned | NodeUncordoned],
        doc: str,
    ) -> None:
        """``POST /v1/nodes/{node}/<action>``: its body (optional; ``body_type()`` when absent) made into
        the operator event ``event_of(node, requested_by, body)``, which :func:`operate` publishes."""

        async def handler(
            caller: Caller,
            node: NodePath,
            request: Request,
            body: Annotated[Any, Depends(strict_body(body_type, optional=True))],
        ) -> OperatorAction:
            event = event_of(node, caller.tenant, body or body_type())
            return await operate(caller, request, node, event, action)

        handler.__name__ = handler.__qualname__ = action  # the route's name and operation id
        handler.__doc__ = doc
        app.post(
            f"/v1/nodes/{{node}}/{action}",
            status_code=status.HTTP_202_ACCEPTED,
            tags=["nodes"],
            responses=problems(*WRITE, 403, 404),
            openapi_extra=body_schema(body_type, required=False),
        )(handler)

    node_action(
        "cordon",
        CordonRequest,
        lambda node, by, body: NodeCordoned(node=node, mode="cordon", reason=body.reason, requested_by=by),
        "Admin only: no new work on the node; what runs there runs on (node.cordoned on nodes.operator).",
    )
    node_action(
        "drain",
        DrainRequest,
        lambda node, by, body: NodeCordoned(
            node=node, mode="drain", reason=body.reason, requested_by=by, drain_grace_s=body.grace_s
        ),
        "Admin only: no new work on the node, and after ``grace_s`` (default 600) every job still there is\n"
        "asked to checkpoint (its own checkpoint grace), then requeued to run elsewhere: the node empties.",
    )
    node_action(
        "uncordon",
        CordonRequest,
        lambda node, by, body: NodeUncordoned(node=node, reason=body.reason, requested_by=by),
        "Admin only: the node takes new work again (node.uncordoned on nodes.operator).",
    )

    @app.get("/v1/history", tags=["jobs"], responses=problems(*READ, 403))
    async def job_history(
        caller: Caller,
        since: SinceQuery = None,
        queue: QueueQuery = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: JobsCursorQuery = None,
    ) -> Page:
        """Accounting (as ``sacct``): jobs submitted or ended at or after ``since`` (RFC 3339), newest
        first, with their runs, start, end, elapsed seconds and the GPU-hours their allocations held.
        A tenant sees the jobs of its queues and, in ``default``, the jobs it submitted."""
        if queue is not None:
            require(caller, queue)
        if since is not None and since.tzinfo is None:
            raise ApiProblem(
                status.HTTP_400_BAD_REQUEST,
                "since needs a time zone (e.g. 2026-01-01T00:00:00Z)",
                kind="bad-time",
            )
        after = _cursor(cursor, JOBS_CURSOR)
        async with res().pool.acquire() as conn:
            items, next_cursor = await queries.history(
                conn,
                seen=seen_by(caller),
                since=since,
                queue=queue,
                now=clock(),
                limit=limit,
                after=(after[0], after[1]) if after else None,
            )
        return Page(items=items, next_cursor=next_cursor)

    @app.get("/v1/queues", tags=["queues"], response_model=QueueList, responses=problems(*READ))
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
        publishes every limited queue from its first event, then at most every GANGLINE_STATUS_INTERVAL_S
        of event time, after usage moved).

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
        lends = _lent_by_tree(reported, quota_tree)
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
                    "lent": None
                    if status is None
                    else {r: v for (q, r), v in sorted(lends.items()) if q == name},
                }
            )
        return {"items": items}

    @app.get("/v1/whoami", tags=["ops"], responses=problems(*READ))
    async def whoami(caller: Caller) -> dict[str, Any]:
        """The caller's tenant, whether it is an admin, and the queues it may read (null: all)."""
        return {"tenant": caller.tenant, "admin": caller.admin, "queues": caller.visible_queues()}

    @app.post("/v1/stream-token", tags=["live"], responses=problems(*READ))
    async def stream_token(caller: Caller) -> dict[str, Any]:
        """A short-lived token for ``GET /v1/stream?token=`` (a browser's EventSource sends no header)."""
        token = stream_tokens.issue(caller, now_s=clock().timestamp())
        return {"token": token, "expires_in_s": stream_tokens.ttl_s}

    @app.get(
        "/v1/stream",
        tags=["live"],
        responses={
            **problems(400, 401, 413, 422, 429, 503),
            200: {"content": {"text/event-stream": {}}, "description": "server-sent events"},
        },
    )
    async def live_stream(
        token: Annotated[str, Query(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9_.-]+$")],
    ) -> StreamingResponse:
        """Server-sent events of what happens on the log, as the caller may see it: ``notice`` (one
        event: type, time, job, node, queue, the job's state as the ledger projected it, a summary),
        ``resync`` (the caller fell behind: reload). A tenant hears of its own jobs and queues only;
        nodes are everyone's. ``token`` comes from ``POST /v1/stream-token``."""
        found = stream_tokens.principal(token, now_s=clock().timestamp())
        if found is None:
            raise ApiProblem(
                status.HTTP_401_UNAUTHORIZED,
                "the stream token is invalid or has expired; ask POST /v1/stream-token for another",
                kind="unauthenticated",
                headers={"WWW-Authenticate": "Bearer"},  # RFC 6750's token, here in the query
            )
        caller = limited(found)
        feed = res().feed
        if feed is None:
            raise ApiProblem(status.HTTP_503_SERVICE_UNAVAILABLE, "no live feed here", kind="unavailable")

        async def events() -> AsyncIterator[str]:
            with feed.subscribe(caller) as subscription:
                async for chunk in stream(subscription):
                    yield chunk

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/v1/analytics/{figure}", tags=["analytics"], responses=problems(*READ))
    async def analytics(
        caller: Caller, figure: AnalyticsFigure, window: Literal["hour", "day"] = "hour"
    ) -> AnalyticsAnswer:
        """The analytics app's figures (its ``/analytics/<figure>``) under ``figures``; for a tenant the rows
        of its own queues only (``default``'s figures sum every tenant's jobs). When the analytics app is
        not configured (GANGLINE_ANALYTICS_URL) or does not answer, ``available`` is false and ``detail``
        says why: the figures are away, the API is not failing."""
        if settings.analytics_url is None:
            return AnalyticsAnswer(available=False, detail="no analytics app is configured", figures=None)
        url = f"{settings.analytics_url.rstrip('/')}/analytics/{figure}"
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                answer = await client.get(url, params={"window": window} if figure == "gpu-hours" else None)
            answer.raise_for_status()
            body = answer.json()
        except (httpx.HTTPError, ValueError) as error:
            detail = f"the analytics app at {settings.analytics_url} did not answer: {type(error).__name__}"
            return AnalyticsAnswer(available=False, detail=detail, figures=None)
        own = caller.own_queues()
        if own is not None and isinstance(body, list):
            body = [row for row in body if isinstance(row, dict) and row.get("queue") in own]
        return AnalyticsAnswer(available=True, detail=None, figures=body)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard/")

    app.mount("/dashboard", StaticFiles(directory=STATIC, html=True), name="dashboard")

    return app


class AnalyticsAnswer(BaseModel):
    available: bool = Field(description="whether the analytics app answered")
    detail: str | None = Field(description="why not, when it did not")
    figures: Any = Field(
        description="the app's JSON: rows per queue and GPU model (capacity: GPUs per model)"
    )


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
    lent: dict[str, float] | None = Field(
        description="per resource: what the queue lends its quota tree (gangline.fold.figures.lent over "
        "quota's published figures of the tree: the tree's borrowed units shared out among the queues that "
        "leave nominal quota idle, in proportion)"
    )
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


def _lent_by_tree(reported: Mapping[str, Mapping[str, Any]], tree: QuotaTree) -> dict[tuple[str, str], float]:
    """``(queue, resource)`` → what the queue lends, per quota tree, from quota's latest statuses."""
    by_tree: dict[str, list[QueueStatus]] = {}
    for name, row in sorted(reported.items()):
        if not tree.has_queue(name):
            continue
        status = QueueStatus(
            queue=name,
            cohort=row["cohort"],
            weight=row["weight"],
            dominant_share=row["dominant_share"],
            dominant_resource=row["dominant_resource"],
            position=row["position"],
            of=row["ranked_among"],
            resources=row["resources"],
            as_of=row["as_of"],
        )
        by_tree.setdefault(tree.root_cohort_of(QueueName(name)), []).append(status)
    out: dict[tuple[str, str], float] = {}
    for statuses in by_tree.values():
        out |= lent(statuses)
    return out


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
        raise ApiProblem(status.HTTP_400_BAD_REQUEST, str(error), kind="bad-cursor") from error


__all__ = ["JobSubmission", "Resources", "create_app", "why"]
