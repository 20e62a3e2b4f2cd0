"""schemathesis' hooks for the API (fuzz_api.py loads them): the two rules of a job submission that JSON
Schema cannot say, kept by the valid (positive) requests it generates.

Each keyword of JSON Schema 2020-12 checks one value at a time, so the OpenAPI cannot say that
``min_workers <= workers <= max_workers``, nor that ``command`` and ``env`` together are at most
``MAX_COMMAND_AND_ENV_BYTES`` of UTF-8 JSON (both are in JobSpec's description, and the API answers 422
naming the rule). A positive case breaking one of them is not schema-valid data the API should take, so
it is brought inside the rule here, changing nothing else; negative cases are left as generated, and
every other refusal of a positive case is still a failure of ``positive_data_acceptance``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import schemathesis

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "libs"), str(ROOT)]

from gangline.events.jobs import MAX_COMMAND_AND_ENV_BYTES, command_and_env_bytes  # noqa: E402

SUBMIT = ("POST", "/v1/jobs")


def _number(value: object) -> bool:
    """A JSON number (an integer may come as ``8.0``: in JSON Schema an integer has no fraction)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def within_the_cross_field_rules(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``workers`` inside ``[min_workers, max_workers]`` and ``command`` + ``env`` within
    their bytes (the largest entries dropped first); everything else as it was."""
    out = dict(body)
    workers, low, high = out.get("workers"), out.get("min_workers"), out.get("max_workers")
    if _number(workers) and _number(low) and low > workers:
        out["workers"] = workers = low
    if _number(workers) and _number(high) and high < workers:
        out["max_workers"] = workers
    command, env = out.get("command", []), out.get("env", {})
    if isinstance(command, list) and isinstance(env, dict):
        command, env = list(command), dict(env)
        while command_and_env_bytes(command, env) > MAX_COMMAND_AND_ENV_BYTES:
            longest_arg = max(command, key=len, default="")
            longest_var = max(env, key=lambda k: len(k) + len(env[k]), default=None)
            if longest_var is not None and len(longest_var) + len(env[longest_var]) >= len(longest_arg):
                del env[longest_var]
            else:
                command.remove(longest_arg)
        out.update({k: v for k, v in (("command", command), ("env", env)) if k in out})
    return out


@schemathesis.hook
def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    operation = context.operation
    if (
        operation is not None
        and (operation.method.upper(), operation.path) == SUBMIT
        and case.meta is not None
        and case.meta.generation.mode.is_positive
        and isinstance(case.body, dict)
    ):
        case.body = within_the_cross_field_rules(case.body)
    return case
