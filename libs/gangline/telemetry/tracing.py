"""Tracer provider setup: one per process, named after the service.

Spans leave the process over OTLP/HTTP (protobuf) only when an endpoint is configured, by
argument or by the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``
variables; with none (and no span processor given), spans are not recorded at all: the
:class:`~gangline.telemetry.light.LightTracerProvider` still gives each one its own id under its
parent's trace, so trace context flows through Kafka headers and envelopes exactly as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace

from gangline.telemetry.light import LightTracerProvider

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
_TRACES_PATH = "v1/traces"

TRACER_NAME = "gangline"


def traces_endpoint(otlp_endpoint: str | None, environ: Mapping[str, str]) -> str | None:
    """The full OTLP/HTTP traces URL to export to, or None when tracing stays in-process.

    An explicit ``otlp_endpoint`` and ``OTEL_EXPORTER_OTLP_ENDPOINT`` are base URLs (the
    ``/v1/traces`` path is appended, as the OTLP spec says); ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    is used as given.
    """
    if otlp_endpoint:
        return _with_traces_path(otlp_endpoint)
    if environ.get(TRACES_ENDPOINT_ENV):
        return environ[TRACES_ENDPOINT_ENV]
    if environ.get(ENDPOINT_ENV):
        return _with_traces_path(environ[ENDPOINT_ENV])
    return None


def _with_traces_path(base: str) -> str:
    if base.rstrip("/").endswith("/" + _TRACES_PATH):
        return base
    return base.rstrip("/") + "/" + _TRACES_PATH


def setup_tracing(
    service_name: str,
    *,
    otlp_endpoint: str | None,
    instance_id: str | None = None,
    span_processors: Sequence[SpanProcessor] = (),
    environ: Mapping[str, str] | None = None,
    install_global: bool = True,
) -> trace.TracerProvider:
    """Build the service's tracer provider and (by default) install it as the global one.

    ``span_processors`` are added after the OTLP exporter (tests pass a ``SimpleSpanProcessor``
    over an ``InMemorySpanExporter``). The global provider can be set only once per process;
    later calls still return a working provider, which callers may inject where a tracer
    provider is accepted.
    """
    endpoint = traces_endpoint(otlp_endpoint, os.environ if environ is None else environ)
    if endpoint is None and not span_processors:
        light = LightTracerProvider()
        if install_global:
            trace.set_tracer_provider(light)
        return light
    # The SDK and the exporter only when spans leave the process: a fifth of a service's imports.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes: dict[str, str] = {"service.name": service_name}
    if instance_id:
        attributes["service.instance.id"] = instance_id
    provider = TracerProvider(resource=Resource.create(attributes))
    if endpoint is not None:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    for processor in span_processors:
        provider.add_span_processor(processor)
    if install_global:
        trace.set_tracer_provider(provider)
    return provider


def get_tracer(provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """Gangline's tracer from ``provider``, or from the global provider when none is given."""
    if provider is None:
        return trace.get_tracer(TRACER_NAME)
    return provider.get_tracer(TRACER_NAME)
