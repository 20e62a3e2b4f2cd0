"""One job, one trace: from the API's job.requested through every service to the grant.

An in-process OTLP/HTTP receiver (protobuf on 127.0.0.1) collects the spans that the real service
processes export (OTEL_EXPORTER_OTLP_ENDPOINT points at it). The job is submitted through the API;
the trace its POST starts must hold the spans of the API, the ledger, and every decision service
down to placement's allocation.granted.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from e2e.harness import wait_healthy
from gangline.bus.admin import delete_topics, ensure_topics
from gangline.telemetry.semconv import EVENT_SUBJECT, EVENT_TYPE
from services.api.auth import hash_token
from services.common.topics import TopicNames

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ("admission", "quota", "placement", "node_health")
TOKEN = "e2e-token-" + uuid.uuid4().hex
REQUESTED = "gangline.job.requested.v1"
GRANTED = "gangline.allocation.granted.v1"
EXPECTED = {"api", "admission", "quota", "placement", "ledger"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, str]


@dataclass
class Receiver:
    """Spans received over OTLP/HTTP, by any exporter, in arrival order."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            ReceivedSpan(
                                service=resource.get("service.name", "?"),
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_id=span.parent_span_id.hex(),
                                attributes={
                                    a.key: a.value.string_value or str(a.value.int_value)
                                    for a in span.attributes
                                },
                            )
                        )

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            received.add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Stack:
    api_url: str
    receiver: Receiver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def present(service: str) -> bool:
    return (ROOT / "services" / service / "__main__.py").is_file()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def stack(
    kafka_bootstrap: str,
    pg_dsn: str,
    receiver: tuple[Receiver, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    received, endpoint = receiver
    prefix = f"t-e2e-{uuid.uuid4().hex[:8]}."
    specs = TopicNames(prefix=prefix).specs()
    await ensure_topics(kafka_bootstrap, specs)
    tokens = tmp_path_factory.mktemp("e2e") / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump({"tenants": [{"name": "e2e", "token_sha256": hash_token(TOKEN), "admin": True}]})
    )
    port = free_port()
    env = {
        **os.environ,
        "GANGLINE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "GANGLINE_PG_DSN": pg_dsn,
        "GANGLINE_TOPIC_PREFIX": prefix,
        "GANGLINE_GROUP_PREFIX": prefix + "g",
        "GANGLINE_PORT": str(port),
        "GANGLINE_TOKENS_FILE": str(tokens),
        "GANGLINE_LOG_LEVEL": "WARNING",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    commands = [["-m", "services.ledger"], ["-m", "services.api"]]
    commands += [["-m", f"services.{name}"] for name in PIPELINE if present(name)]
    if present("agent"):
        commands.append(["-m", "services.agent", "--nodes", "2", "--heartbeat-s", "1"])
    procs = [await asyncio.create_subprocess_exec(sys.executable, *c, cwd=ROOT, env=env) for c in commands]
    api_url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(api_url, procs)
        yield Stack(api_url, received)
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                p.kill()
        await delete_topics(kafka_bootstrap, [s.name for s in specs])


async def submit(stack: Stack, job: dict[str, object]) -> tuple[str, str]:
    """POST the job; the job id and the trace id the API's server span started."""
    async with httpx.AsyncClient(base_url=stack.api_url) as client:
        response = await client.post("/v1/jobs", json=job, headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 202, response.text
        job_id = response.json()["job_id"]
        for _ in range(300):
            found = await client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {TOKEN}"})
            if found.status_code == 200 and found.json()["events"]:
                traceparent = found.json()["events"][0]["traceparent"]
                return job_id, traceparent.split("-")[1]
            await asyncio.sleep(0.1)
    raise AssertionError(f"the ledger never recorded {job_id}")


async def until_allocated(stack: Stack, job_id: str, timeout_s: float = 60.0) -> None:
    async with httpx.AsyncClient(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        for _ in range(int(timeout_s / 0.2)):
            if (await client.get(f"/v1/jobs/{job_id}")).json()["allocations"]:
                return
            await asyncio.sleep(0.2)
    raise AssertionError(f"{job_id} was never granted GPUs")


async def spans_until(
    stack: Stack, trace_id: str, done: object, timeout_s: float = 60.0
) -> list[ReceivedSpan]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        spans = stack.receiver.trace(trace_id)
        if done(spans) or loop.time() > deadline:  # type: ignore[operator]
            return spans
        await asyncio.sleep(0.2)


def services_in(spans: list[ReceivedSpan]) -> set[str]:
    return {s.service for s in spans}


async def test_the_api_and_the_ledger_share_the_trace_of_a_submission(stack: Stack) -> None:
    job_id, trace_id = await submit(stack, {"queue": "default", "workers": 1, "gpus_per_worker": 1})

    def requested(spans: list[ReceivedSpan], service: str) -> list[ReceivedSpan]:
        return [s for s in spans if s.service == service and s.attributes.get(EVENT_TYPE) == REQUESTED]

    def posts(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in spans if (s.service, s.name) == ("api", "POST /v1/jobs")]

    # Each process exports on its own schedule: wait for both ends of the hop.
    spans = await spans_until(stack, trace_id, lambda s: bool(requested(s, "ledger") and posts(s)))
    [post] = posts(spans)
    sends = requested(spans, "api")
    stored = requested(spans, "ledger")
    assert post.parent_id == ""  # the submission starts the trace
    assert [s.parent_id for s in sends] == [post.span_id]
    assert [s.parent_id for s in stored] == [sends[0].span_id]
    assert stored[0].attributes[EVENT_SUBJECT] == job_id


@pytest.mark.skipif(
    not all(present(s) for s in (*PIPELINE, "agent")), reason="the pipeline services are not all here"
)
async def test_one_trace_runs_from_the_request_through_every_service_to_the_grant(stack: Stack) -> None:
    # Placement decides when it learns something: until it has seen the nodes, a job waits and is
    # granted in the trace of the node's registration. A first job placed proves the nodes are known.
    warm_up, _ = await submit(stack, {"queue": "default", "workers": 1, "gpus_per_worker": 1})
    await until_allocated(stack, warm_up)
    job_id, trace_id = await submit(stack, {"queue": "default", "workers": 2, "gpus_per_worker": 2})

    def granted(spans: list[ReceivedSpan]) -> bool:
        return any(s.attributes.get(EVENT_TYPE) == GRANTED for s in spans)

    def orphans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        ids = {s.span_id for s in spans}
        return [s for s in spans if s.parent_id and s.parent_id not in ids]

    def complete(spans: list[ReceivedSpan]) -> bool:
        # Every process exports on its own schedule: wait until the grant's readers and every parent are in.
        ledger = [s for s in spans if s.service == "ledger" and s.attributes.get(EVENT_TYPE) == GRANTED]
        return granted(spans) and bool(ledger) and services_in(spans) >= EXPECTED and not orphans(spans)

    spans = await spans_until(stack, trace_id, complete)
    seen = sorted({(s.service, s.attributes.get(EVENT_TYPE, "")) for s in spans})
    assert granted(spans), f"no grant in the trace; seen: {seen}"
    assert services_in(spans) >= EXPECTED
    lost = [(o.service, o.name) for o in orphans(spans)]
    assert not lost, f"spans whose parent is not in the trace: {lost}"
    sent = [s for s in spans if s.attributes.get(EVENT_TYPE) == GRANTED and s.name.startswith("send ")]
    assert [(s.service, s.attributes[EVENT_SUBJECT]) for s in sent] == [("placement", job_id)]
    readers = {s.service for s in spans if s.attributes.get(EVENT_TYPE) == GRANTED} - {"placement"}
    assert "ledger" in readers  # the grant's readers continue the same trace
