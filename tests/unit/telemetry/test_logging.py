from __future__ import annotations

import io
import json
import logging

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from gangline.telemetry import JsonFormatter


def _logger(stream: io.StringIO) -> logging.Logger:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("admission"))
    logger = logging.getLogger("test.gangline.json")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_a_line_is_json_with_service_message_and_extra_fields() -> None:
    stream = io.StringIO()
    _logger(stream).info("admitted %s", "j1", extra={"job_id": "j1", "gpus": 8})
    line = json.loads(stream.getvalue())
    assert line["service"] == "admission"
    assert line["message"] == "admitted j1"
    assert line["level"] == "INFO"
    assert (line["job_id"], line["gpus"]) == ("j1", 8)
    assert "trace_id" not in line


def test_inside_a_span_the_line_names_its_trace_and_span() -> None:
    stream = io.StringIO()
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("admit") as span:
        _logger(stream).warning("quota exceeded")
        context = span.get_span_context()
    line = json.loads(stream.getvalue())
    assert line["trace_id"] == trace.format_trace_id(context.trace_id)
    assert line["span_id"] == trace.format_span_id(context.span_id)


def test_exceptions_are_kept_in_one_line() -> None:
    stream = io.StringIO()
    try:
        raise ValueError("bad gang")
    except ValueError:
        _logger(stream).exception("failed")
    text = stream.getvalue()
    assert text.count("\n") == 1
    assert "ValueError: bad gang" in json.loads(text)["exception"]
