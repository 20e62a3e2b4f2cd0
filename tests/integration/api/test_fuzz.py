"""schemathesis against the OpenAPI of a real API process: no server error, and every answer as promised.

A bounded, seeded slice (every phase: examples, boundary coverage, random data, call sequences); the long
run is ``make fuzz-api``.
"""

from __future__ import annotations

from pathlib import Path

import asyncpg
from fuzz_api import CONFORMANCE, running_api, schemathesis

MAX_EXAMPLES = 15
SEED = 20261201


async def test_schemathesis_finds_no_server_error_no_answer_off_the_schema_and_no_valid_request_refused(
    kafka_bootstrap: str, pg_dsn: str, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    async with running_api(kafka_bootstrap, pg_dsn, tmp_path) as api:
        code, output, report = await schemathesis(
            api,
            tmp_path / "report.json",
            max_examples=MAX_EXAMPLES,
            seed=SEED,
            checks=(*CONFORMANCE, "positive_data_acceptance"),
        )
    assert report, output
    assert report["operations"]["tested"] == report["operations"]["total"] == 16, output
    assert report["test_cases"]["generated"] > 100, output
    assert (report["failures"], report["errors"]) == ([], []), output
    assert code == 0, output
