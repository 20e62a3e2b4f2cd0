"""The committed JSON Schema of a job request says what the model takes: what one refuses, the other
refuses too (found by the fuzz, tests/e2e/fuzz_requests.py: env names and the slice rule were checked by
the model only, so schema-valid requests were dead-lettered)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from e2e.fuzz_requests import schema_derived

from gangline.events import codec

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
REQUESTED = json.loads((SCHEMAS / "events" / "job.requested" / "v1.json").read_text())


def _message(**data: Any) -> dict[str, Any]:
    message: dict[str, Any] = json.loads((SCHEMAS / "examples" / "job.requested.v1.json").read_bytes())
    message["data"].update(data)
    return message


@pytest.mark.parametrize(
    "data",
    [
        {"env": {"0BAD": "x"}},
        {"env": {"A-B": "x"}},
        {"gpus_per_worker": 2, "mig_profile": "1g.10gb"},
        {"gpus_per_worker": 1, "gpu_fraction_milli": 250},
        {"gpus_per_worker": 0, "mig_profile": "1g.10gb", "gpu_fraction_milli": 250},
        {"gpus_per_worker": 0},
    ],
)
def test_what_the_model_refuses_the_schema_refuses(data: dict[str, Any]) -> None:
    message = _message(**data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(REQUESTED).validate(message)
    with pytest.raises(codec.SchemaViolation):
        codec.decode(json.dumps(message).encode())


@pytest.mark.parametrize(
    "data",
    [{"env": {"_OK_1": "x"}}, {"gpus_per_worker": 0, "mig_profile": "1g.10gb"}, {"gpus_per_worker": 3}],
)
def test_what_the_model_takes_the_schema_takes(data: dict[str, Any]) -> None:
    message = _message(**data)
    jsonschema.Draft202012Validator(REQUESTED).validate(message)
    codec.decode(json.dumps(message).encode())


def test_requests_drawn_from_the_schema_decode_but_for_the_elastic_bounds() -> None:
    # min_workers <= workers <= max_workers compares two values: JSON Schema cannot say it.
    for message in schema_derived(20, seed=11):
        if message["type"] != "gangline.job.requested.v1":
            continue
        data = message["data"]
        data.pop("min_workers", None)
        data.pop("max_workers", None)
        message["subject"] = data["job_id"]
        codec.decode(json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass"))
