from __future__ import annotations

from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gangline.telemetry import get_tracer, setup_tracing, traces_endpoint


def test_no_endpoint_anywhere_means_no_export() -> None:
    assert traces_endpoint(None, {}) is None
    assert traces_endpoint("", {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) is None


def test_base_endpoints_get_the_traces_path() -> None:
    assert traces_endpoint("http://collector:4318", {}) == "http://collector:4318/v1/traces"
    assert traces_endpoint("http://collector:4318/", {}) == "http://collector:4318/v1/traces"
    assert traces_endpoint("http://collector:4318/v1/traces", {}) == "http://collector:4318/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"}
    assert traces_endpoint(None, env) == "http://otel:4318/v1/traces"


def test_argument_beats_environment_and_signal_variable_is_used_as_given() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/custom",
    }
    assert traces_endpoint(None, env) == "http://traces:4318/custom"
    assert traces_endpoint("http://arg:4318", env) == "http://arg:4318/v1/traces"


def _processors(provider: object) -> list[object]:
    # The SDK keeps its processors in a multi-processor; good enough to see what was wired.
    return list(provider._active_span_processor._span_processors)  # type: ignore[attr-defined]


def test_provider_names_the_service_and_feeds_given_processors() -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing(
        "placement",
        otlp_endpoint=None,
        instance_id="placement-0",
        span_processors=[SimpleSpanProcessor(exporter)],
        environ={},
        install_global=False,
    )
    assert not any(isinstance(p, BatchSpanProcessor) for p in _processors(provider))
    with get_tracer(provider).start_as_current_span("decide"):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.name == "decide"
    assert span.resource.attributes["service.name"] == "placement"
    assert span.resource.attributes["service.instance.id"] == "placement-0"
    provider.shutdown()


def test_an_endpoint_from_the_environment_adds_the_otlp_exporter() -> None:
    provider = setup_tracing(
        "quota",
        otlp_endpoint=None,
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
        install_global=False,
    )
    (processor,) = _processors(provider)
    assert isinstance(processor, BatchSpanProcessor)
    exporter = processor._batch_processor._exporter  # type: ignore[attr-defined]
    assert exporter._endpoint == "http://127.0.0.1:4318/v1/traces"
    provider.shutdown()
