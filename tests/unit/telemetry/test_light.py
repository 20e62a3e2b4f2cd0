from __future__ import annotations

import random

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from gangline.telemetry import setup_tracing
from gangline.telemetry.light import LightTracer, LightTracerProvider
from gangline.telemetry.propagation import context_from_traceparent, traceparent_of

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_child_keeps_its_parent_s_trace_and_flags_with_a_span_id_of_its_own() -> None:
    tracer = LightTracer(random.Random(7))
    with tracer.start_as_current_span(
        "process", context=context_from_traceparent(PARENT), kind=SpanKind.CONSUMER
    ):
        outer = traceparent_of()
        with tracer.start_as_current_span("send", kind=SpanKind.PRODUCER):
            inner = traceparent_of()
    assert outer is not None and inner is not None
    version, trace_id, span_id, flags = outer.split("-")
    assert (version, trace_id, flags) == ("00", "0af7651916cd43dd8448eb211c80319c", "01")
    assert span_id not in ("b7ad6b7169203331", "0" * 16)
    assert inner.split("-")[1] == trace_id and inner.split("-")[2] != span_id
    assert traceparent_of() is None  # nothing left attached


def test_an_unsampled_parent_stays_unsampled_and_no_parent_starts_a_sampled_trace() -> None:
    tracer = LightTracer(random.Random(1))
    unsampled = PARENT[:-2] + "00"
    with tracer.start_as_current_span("p", context=context_from_traceparent(unsampled)):
        assert (traceparent_of() or "").endswith("-00")
    with tracer.start_as_current_span("root"):
        root = traceparent_of() or ""
    assert root.endswith("-01") and root.split("-")[1] != "0af7651916cd43dd8448eb211c80319c"
    span = tracer.start_span("x")
    assert not span.is_recording()


def test_setup_records_spans_only_where_they_can_go_somewhere() -> None:
    quiet = setup_tracing("svc", otlp_endpoint=None, environ={}, install_global=False)
    assert isinstance(quiet, LightTracerProvider)
    exporting = setup_tracing("svc", otlp_endpoint="http://127.0.0.1:4318", environ={}, install_global=False)
    assert isinstance(exporting, TracerProvider)
    exporting.shutdown()
