"""OpenTelemetry setup, W3C trace context in Kafka headers, and structured logging."""

from gangline.telemetry.logging import JsonFormatter, setup_logging
from gangline.telemetry.propagation import (
    KafkaHeaders,
    context_from_traceparent,
    extract_context,
    inject_headers,
    span_context_of,
    traceparent_of,
    with_trace_headers,
)
from gangline.telemetry.tracing import get_tracer, setup_tracing, traces_endpoint

__all__ = [
    "JsonFormatter",
    "KafkaHeaders",
    "context_from_traceparent",
    "extract_context",
    "get_tracer",
    "inject_headers",
    "setup_logging",
    "setup_tracing",
    "span_context_of",
    "traceparent_of",
    "traces_endpoint",
    "with_trace_headers",
]
