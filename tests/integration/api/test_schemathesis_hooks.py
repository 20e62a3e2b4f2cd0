"""The hook that keeps schemathesis' valid submissions inside the two rules JSON Schema cannot say."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from schemathesis_hooks import within_the_cross_field_rules

from gangline.events.jobs import MAX_COMMAND_AND_ENV_BYTES, command_and_env_bytes
from services.api.app import JobSubmission

BASE: dict[str, Any] = {"queue": "q", "workers": 2, "gpus_per_worker": 1}


@pytest.mark.parametrize(
    "extra",
    [
        {"min_workers": 99_999, "workers": 1},
        {"max_workers": 292.0, "min_workers": 6034, "workers": 6034},
        {"min_workers": 5, "workers": 1, "max_workers": 3},
        {"command": ["x" * 4096] * 70},
        {"env": {f"V{i}": "é" * 32_768 for i in range(8)}, "command": ["a" * 4096] * 10},
    ],
)
def test_a_body_breaking_a_cross_field_rule_is_brought_inside_it_and_then_taken(
    extra: dict[str, Any],
) -> None:
    body = {**BASE, **extra}
    with pytest.raises(ValidationError):
        JobSubmission.model_validate_json(json.dumps(body))
    kept = within_the_cross_field_rules(body)
    spec = JobSubmission.model_validate(
        {k: int(v) if isinstance(v, float) else v for k, v in kept.items()}, strict=False
    )
    assert (spec.min_workers or spec.workers) <= spec.workers <= (spec.max_workers or spec.workers)
    assert command_and_env_bytes(spec.command, spec.env) <= MAX_COMMAND_AND_ENV_BYTES
    assert {k: v for k, v in kept.items() if k not in extra} == {
        k: v for k, v in BASE.items() if k not in extra
    }


def test_a_body_inside_the_rules_is_left_as_it_was() -> None:
    body = {**BASE, "min_workers": 1, "max_workers": 4, "command": ["python", "train.py"], "env": {"A": "1"}}
    assert within_the_cross_field_rules(body) == body
