from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from gangline.telemetry import (
    context_from_traceparent,
    extract_context,
    inject_headers,
    span_context_of,
    traceparent_of,
    with_trace_headers,
)

TRACER = TracerProvider().get_tracer("test")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_no_span_no_headers() -> None:
    assert inject_headers() == []
    assert traceparent_of() is None


def test_headers_carry_the_current_span_and_come_back_as_its_context() -> None:
    with TRACER.start_as_current_span("send") as span:
        headers = inject_headers()
        sent = span.get_span_context()
    assert [name for name, _ in headers] == ["traceparent"]
    assert all(isinstance(value, bytes) for _, value in headers)
    received = span_context_of(headers)
    assert received.is_remote
    assert (received.trace_id, received.span_id) == (sent.trace_id, sent.span_id)
    assert received.trace_flags == sent.trace_flags


def test_tracestate_travels_too() -> None:
    parent = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("gangline", "p1")]),
    )
    context = trace.set_span_in_context(NonRecordingSpan(parent))
    headers = dict(inject_headers(context))
    assert headers == {"traceparent": TRACEPARENT.encode(), "tracestate": b"gangline=p1"}
    assert span_context_of(list(headers.items())).trace_state.get("gangline") == "p1"


def test_extract_ignores_garbage_and_missing_headers() -> None:
    assert not span_context_of(None).is_valid
    assert not span_context_of([]).is_valid
    assert not span_context_of([("traceparent", b"not-a-traceparent")]).is_valid
    assert not span_context_of([("traceparent", b"\xff\xfe")]).is_valid
    assert not span_context_of([("other", TRACEPARENT.encode())]).is_valid


def test_last_traceparent_header_wins() -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    headers = [("traceparent", other.encode()), ("traceparent", TRACEPARENT.encode())]
    assert span_context_of(headers).trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736


def test_with_trace_headers_replaces_old_trace_headers_and_keeps_the_rest() -> None:
    old = [("traceparent", b"00-old"), ("tracestate", b"x=y"), ("gangline-origin", b"api")]
    with TRACER.start_as_current_span("send") as span:
        headers = with_trace_headers(old)
        trace_id = span.get_span_context().trace_id
    assert [name for name, _ in headers] == ["gangline-origin", "traceparent"]
    assert span_context_of(headers).trace_id == trace_id


def test_bare_traceparent_attribute_gives_the_same_context_as_the_header() -> None:
    from_attribute = trace.get_current_span(context_from_traceparent(TRACEPARENT)).get_span_context()
    from_headers = trace.get_current_span(extract_context([("traceparent", TRACEPARENT.encode())]))
    assert from_attribute == from_headers.get_span_context()
    assert not trace.get_current_span(context_from_traceparent(None)).get_span_context().is_valid
